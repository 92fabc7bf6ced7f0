// lanebus — MIT License.
// The publish path of durable topics: the store append of a message (also the
// outbox of transactions), one publish, and publish_batch as one request to
// the store's writer.
#include <string_view>
#include <utility>

#include "bus_impl.hpp"
#include "hash.hpp"

namespace lanebus::detail {

AppendRequest TopicImpl::append_request(const OutgoingMessage& m, std::string_view headers) const {
  AppendRequest req;
  req.topic_id = store_topic.id;
  req.lane = lane_for_key(m.key, options.lanes);
  req.header.id = 0;  // the store assigns ids unique across restarts and processes
  req.header.created_at_ns = now_ns();
  req.header.correlation_id = m.correlation_id;
  req.header.fencing_token = m.fencing_token;
  req.header.content_type = m.content_type;
  req.header.schema_version = m.schema_version;
  req.key.assign(m.key);
  req.idempotency_key.assign(m.idempotency_key);
  req.payload.assign(m.payload);
  req.headers.assign(headers);
  return req;
}

Status TopicImpl::publish_durable(const OutgoingMessage& m, PublishCallback done) {
  if (m.payload.empty()) return Status::from_literal(Code::InvalidArgument, "publish: the payload is empty");
  if (m.payload.size() > options.max_payload)
    return Status::from_literal(Code::PayloadTooLarge,
                                "publish: the payload exceeds the topic's max_payload (raise "
                                "TopicOptions::max_payload, at most 64 MiB on a durable topic)");
  if (bus->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
  std::uint16_t schema_version;
  if (Status st = check_schema(m, &schema_version); !st.ok()) return st;
  HeaderBlock headers;  // headers and the calling handler's trace context (trace.hpp)
  if (Status st = stored_headers(m, &headers); !st.ok()) return st;
  // Tenancy: the namespace's publish quota and usage (lib/features/tenancy.hpp).
  NamespaceState* const nsp = ns.load(std::memory_order_acquire);
  const std::size_t need = m.key.size() + m.idempotency_key.size() + m.payload.size();
  if (Status q = nsp->admit_publish(need, !done && options.backpressure == Backpressure::Block,
                                    options.block_timeout);
      !q.ok())
    return q;
  AppendRequest req = append_request(m, headers.bytes());
  req.header.schema_version = schema_version;
  const std::uint32_t lane = req.lane;
  if (has_times(m, default_ttl_ns)) [[unlikely]] {
    // A due time or an expiry (delayed_durable.cpp): a delayed message waits in the store's delayed index.
    bool handled = false;
    Status st = publish_timed_durable(m, req, nsp, need, done, &handled);
    if (!st.ok() || handled) return st;
  }
  if (!done) {
    auto r = bus->store()->append(std::move(req));
    if (!r.ok()) {
      nsp->unadmit_publish(need);
      refused.fetch_add(1, std::memory_order_relaxed);
      return r.status();
    }
    lane_load[lane].published.fetch_add(1, std::memory_order_relaxed);
    return Status();
  }
  Status s = bus->store()->append_async(
      std::move(req), [this, lane, nsp, need, done = std::move(done)](const Status& st, const AppendResult& res) {
        if (st.ok()) {
          lane_load[lane].published.fetch_add(1, std::memory_order_relaxed);
        } else {
          nsp->unadmit_publish(need);
          refused.fetch_add(1, std::memory_order_relaxed);
        }
        done(st, res.offset);
      });
  if (!s.ok()) {
    nsp->unadmit_publish(need);
    refused.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

}  // namespace lanebus::detail
