// lanebus — MIT License.
// Client: a bus handle bound to a credential (manual: doc/tenancy.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/bus.hpp"
#include "lanebus/dlq.hpp"
#include "lanebus/tenancy.hpp"

namespace lanebus {

/// The calls of Bus, restricted to what the credential's grants allow
/// (tenancy.hpp, Grant). With BusOptions::access_control on, a call on a name
/// no grant covers returns PermissionDenied — naming the credential, the
/// action and the name, never the secret — and does nothing: nothing is
/// published, stored or delivered. With access control off every call is
/// allowed (the Client then only tags usage). Grant changes
/// (Namespaces::set_grants, remove_credential) apply to existing Clients at
/// their next call.
///
/// Obtained from Bus::client(credential); valid while its Bus lives.
/// Thread safety: one thread at a time (it caches the credential's grants);
/// copies are independent and cheap, make one per thread.
class LANEBUS_API Client {
 public:
  Client() noexcept;
  Client(const Client&);
  Client& operator=(const Client&);
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;
  ~Client();

  /// The credential id.
  const std::string& id() const noexcept;

  // ---- admin on the name ----
  Result<Topic> create_topic(std::string_view name, const TopicOptions& options = {});
  Result<Topic> create_queue(std::string_view name, const TopicOptions& options = {});
  Status seek(const Topic& topic, std::string_view group, const StartPosition& position);

  // ---- any grant on the name ----
  Result<Topic> find(std::string_view name);

  // ---- publish on the topic ----
  /// As Topic::publish, plus PermissionDenied.
  Status publish(const Topic& topic, const OutgoingMessage& message) noexcept;
  Status try_publish(const Topic& topic, const OutgoingMessage& message) noexcept;
  Status publish_async(const Topic& topic, const OutgoingMessage& message, PublishCallback done);

  // ---- consume on the topic (and on GroupOptions::idempotency_scope) ----
  Result<Subscription> subscribe(const Topic& topic, std::string_view group, Handler handler,
                                 const GroupOptions& options = {});
  Result<Subscription> consume(const Topic& queue, Handler handler, const GroupOptions& options = {});
  Result<Subscription> subscribe_tx(const Topic& topic, std::string_view group, TxHandler handler,
                                    const GroupOptions& options = {});
  Result<Subscription> consume_tx(const Topic& queue, TxHandler handler, const GroupOptions& options = {});
  /// consume on `table`.
  Result<std::string> table_get(std::string_view table, std::string_view key);
  /// consume on `scope`.
  Result<IdempotencyTable*> idempotency(std::string_view scope, const IdempotencyOptions& options = {});

  // ---- the dead-letter queue: admin on each entry's origin topic ----
  /// Entries of topics the credential has admin on (others are left out).
  Result<std::vector<DlqEntry>> dlq_list(const DlqFilter& filter = {});
  Result<DlqEntry> dlq_show(std::uint64_t id);
  /// All ids are checked first: one denied id refuses the whole call.
  Result<std::uint64_t> dlq_replay(const std::vector<std::uint64_t>& ids, std::string_view operator_name);
  Status dlq_archive(const std::vector<std::uint64_t>& ids, std::string_view operator_name);
  Result<std::uint64_t> dlq_purge(const std::vector<std::uint64_t>& ids, std::string_view operator_name);

 private:
  friend class Bus;
  friend struct detail::Access;
  struct State;
  explicit Client(std::unique_ptr<State> state) noexcept;
  Status check(int action, std::string_view name) noexcept;
  Status check_publish(const Topic& topic) noexcept;
  std::unique_ptr<State> state_;
};

}  // namespace lanebus
