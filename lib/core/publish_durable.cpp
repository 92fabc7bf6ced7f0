// lanebus — MIT License.
// The publish path of durable topics: the store append of a message (also the
// outbox of transactions), one publish, and publish_batch as one request to
// the store's writer.
#include <exception>
#include <string_view>
#include <utility>
#include <vector>

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

Status TopicImpl::durable_request(const OutgoingMessage& m, bool may_block, AppendRequest* req,
                                  DurableAdmission* admitted) {
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
  *req = append_request(m, headers.bytes());  // may throw (out of memory): before the admission
  req->header.schema_version = schema_version;
  // Tenancy: the namespace's publish quota and usage (lib/features/tenancy.hpp).
  NamespaceState* const nsp = ns.load(std::memory_order_acquire);
  const std::size_t need = m.key.size() + m.idempotency_key.size() + m.payload.size();
  if (Status q = nsp->admit_publish(need, may_block && options.backpressure == Backpressure::Block,
                                    options.block_timeout);
      !q.ok())
    return q;
  *admitted = DurableAdmission{nsp, need, req->lane};
  return Status();
}

Status TopicImpl::publish_durable(const OutgoingMessage& m, PublishCallback done) {
  AppendRequest req;
  DurableAdmission a;
  if (Status st = durable_request(m, !done, &req, &a); !st.ok()) return st;
  if (has_times(m, default_ttl_ns)) [[unlikely]] {
    // A due time or an expiry (delayed_durable.cpp): a delayed message waits in the store's delayed index.
    bool handled = false;
    Status st = timed.publish_durable(m, req, a.nsp, a.need, done, &handled);
    if (!st.ok() || handled) return st;
  }
  if (!done) {
    auto r = bus->store()->append(std::move(req));
    if (!r.ok()) {
      a.nsp->unadmit_publish(a.need);
      refused.fetch_add(1, std::memory_order_relaxed);
      return r.status();
    }
    lane_load[a.lane].published.fetch_add(1, std::memory_order_relaxed);
    return Status();
  }
  Status s = bus->store()->append_async(
      std::move(req), [this, a, done = std::move(done)](const Status& st, const AppendResult& res) {
        if (st.ok()) {
          lane_load[a.lane].published.fetch_add(1, std::memory_order_relaxed);
        } else {
          a.nsp->unadmit_publish(a.need);
          refused.fetch_add(1, std::memory_order_relaxed);
        }
        done(st, res.offset);
      });
  if (!s.ok()) {
    a.nsp->unadmit_publish(a.need);
    refused.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

namespace {
Status batch_out_of_memory() noexcept {
  return Status::from_literal(Code::Internal, "publish_batch: out of memory copying the messages for the store");
}
}  // namespace

BatchPublishResult TopicImpl::publish_batch_durable(std::span<const OutgoingMessage> ms) noexcept {
  BatchPublishResult r;
  std::vector<AppendRequest> requests;
  std::vector<DurableAdmission> admitted;
  try {
    requests.reserve(ms.size());
    admitted.reserve(ms.size());  // push_back below cannot throw
  } catch (const std::exception&) {
    r.status = batch_out_of_memory();
    return r;
  }
  // What this run admitted goes back when its messages are not appended.
  auto unadmit_from = [&admitted](std::size_t k) noexcept {
    for (; k < admitted.size(); ++k) admitted[k].nsp->unadmit_publish(admitted[k].need);
  };
  std::size_t i = 0;
  while (i < ms.size()) {
    // A run of messages without a due time or an expiry: one request to the
    // store's writer (DurableStore::append_batch), one wait.
    requests.clear();
    admitted.clear();
    Status refused_up_front;
    DurableStore::AppendBatchResult res;
    try {
      for (; i < ms.size() && !has_times(ms[i], default_ttl_ns); ++i) {
        AppendRequest req;
        DurableAdmission a;
        refused_up_front = durable_request(ms[i], true, &req, &a);
        if (!refused_up_front.ok()) break;
        requests.push_back(std::move(req));
        admitted.push_back(a);
      }
      // Throws only before anything is queued (append_batch).
      if (!requests.empty()) res = bus->store()->append_batch(requests);
    } catch (const std::exception&) {
      unadmit_from(0);
      r.status = batch_out_of_memory();
      return r;
    }
    for (std::size_t k = 0; k < res.appended; ++k) {
      lane_load[admitted[k].lane].published.fetch_add(1, std::memory_order_relaxed);
    }
    unadmit_from(res.appended);
    r.published += res.appended;
    if (res.appended < requests.size()) {
      refused.fetch_add(1, std::memory_order_relaxed);
      r.status = res.status;
      return r;
    }
    if (!refused_up_front.ok()) {
      r.status = refused_up_front;
      return r;
    }
    if (i < ms.size()) {
      // A delayed or expiring message: alone, through the delayed index.
      try {
        r.status = publish_durable(ms[i], {});
      } catch (const std::exception&) {
        r.status = batch_out_of_memory();
      }
      if (!r.status.ok()) return r;
      ++r.published;
      ++i;
    }
  }
  return r;
}

}  // namespace lanebus::detail
