// lanebus — MIT License.
// Namespaces (administration) and Client (a credential-bound bus handle):
// checks, then the Bus call (manual: doc/tenancy.md).
#include "lanebus/client.hpp"

#include <string>

#include "bus_impl.hpp"
#include "names.hpp"
#include "tenancy.hpp"

namespace lanebus {

// ---------------------------------------------------------------- Namespaces

Status Namespaces::create(std::string_view name, const NamespacePolicy& policy) {
  return core_->tenancy()->create(name, policy);
}
Status Namespaces::set_policy(std::string_view name, const NamespacePolicy& policy) {
  return core_->tenancy()->set_policy(name, policy);
}
Result<NamespaceInfo> Namespaces::describe(std::string_view name) const { return core_->tenancy()->describe(name); }
std::vector<NamespaceInfo> Namespaces::list() const { return core_->tenancy()->list(); }
Result<std::string> Namespaces::namespace_of(std::string_view name) const {
  if (Status s = detail::check_name(name, "name"); !s.ok()) return s;
  return core_->tenancy()->namespace_of(name);
}
Status Namespaces::add_credential(const Credential& credential, const std::vector<Grant>& grants) {
  return core_->tenancy()->add_credential(credential, grants);
}
Status Namespaces::set_grants(std::string_view id, const std::vector<Grant>& grants) {
  return core_->tenancy()->set_grants(id, grants);
}
Status Namespaces::remove_credential(std::string_view id) { return core_->tenancy()->remove_credential(id); }
Result<std::vector<Grant>> Namespaces::grants(std::string_view id) const { return core_->tenancy()->grants(id); }

Namespaces* Bus::namespaces() noexcept { return core_->namespaces(); }

// ---------------------------------------------------------------- Client

namespace {
enum Action : int { kPublish = 1, kConsume = 2, kAdmin = 4, kAny = 7 };

Status no_client() noexcept {
  return Status::from_literal(Code::InvalidArgument, "client: a default-constructed or moved-from Client");
}

const char* action_name(int a) {
  switch (a) {
    case kPublish: return "publish on";
    case kConsume: return "subscribe to / consume from";
    case kAdmin: return "administer";
    default: return "use";
  }
}
}  // namespace

struct Client::State {
  Bus* bus = nullptr;
  bool enforce = false;
  std::string id;
  std::shared_ptr<detail::CredentialState> cred;  // null when not enforced
  std::uint64_t seen = 0;                          // cred->version the cache was taken at
  std::shared_ptr<const std::vector<Grant>> grants;
  // The last topic a publish was allowed on, under grants version `seen`:
  // a publisher's next publish there costs one atomic load, not a grant walk.
  const detail::TopicImpl* publish_ok = nullptr;
};

Client::Client() noexcept = default;
Client::Client(std::unique_ptr<State> state) noexcept : state_(std::move(state)) {}
Client::Client(const Client& o) : state_(o.state_ ? std::make_unique<State>(*o.state_) : nullptr) {}
Client& Client::operator=(const Client& o) {
  if (this != &o) state_ = o.state_ ? std::make_unique<State>(*o.state_) : nullptr;
  return *this;
}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;
Client::~Client() = default;

const std::string& Client::id() const noexcept {
  static const std::string kNone;
  return state_ ? state_->id : kNone;
}

Result<Client> Bus::client(const Credential& credential) {
  detail::TenancyImpl* t = core_->tenancy();
  auto st = std::make_unique<Client::State>();
  st->bus = this;
  st->id = credential.id;
  st->enforce = core_->options.access_control;
  if (st->enforce) {
    auto c = t->authenticate(credential);
    if (!c.ok()) return c.status();
    st->cred = std::move(*c);
  } else {
    if (Status s = detail::check_name(credential.id, "credential id"); !s.ok()) return s;
  }
  return Client(std::move(st));
}

Status Client::check(int action, std::string_view name) noexcept {
  if (!state_ || state_->bus == nullptr) return no_client();
  if (!state_->enforce) return Status();
  detail::CredentialState& c = *state_->cred;
  // acquire: pairs with the release bump in set_grants / remove_credential.
  if (const std::uint64_t v = c.version.load(std::memory_order_acquire); v != state_->seen) {
    detail::MutexLock l(&c.mu);
    state_->grants = c.grants;
    state_->seen = c.version.load(std::memory_order_relaxed);
    state_->publish_ok = nullptr;
  }
  for (const Grant& g : *state_->grants) {
    const bool allows = ((action & kPublish) && g.publish) || ((action & kConsume) && g.consume) ||
                        ((action & kAdmin) && g.admin);
    if (allows && detail::prefix_covers(g.prefix, name)) return Status();
  }
  try {
    return Status(Code::PermissionDenied, "credential \"" + state_->id + "\" may not " + action_name(action) + " \"" +
                                              std::string(name) + "\" (no grant covers it; Namespaces::set_grants)");
  } catch (...) {
    return Status::from_literal(Code::PermissionDenied, "access denied (no grant covers the name)");
  }
}

Result<Topic> Client::create_topic(std::string_view name, const TopicOptions& options) {
  if (Status s = check(kAdmin, name); !s.ok()) return s;
  return state_->bus->create_topic(name, options);
}

Result<Topic> Client::create_queue(std::string_view name, const TopicOptions& options) {
  if (Status s = check(kAdmin, name); !s.ok()) return s;
  return state_->bus->create_queue(name, options);
}

Status Client::seek(const Topic& topic, std::string_view group, const StartPosition& position) {
  if (Status s = check(kAdmin, topic.name()); !s.ok()) return s;
  return state_->bus->seek(topic, group, position);
}

Result<Topic> Client::find(std::string_view name) {
  if (Status s = check(kAny, name); !s.ok()) return s;
  return state_->bus->find(name);
}

Status Client::check_publish(const Topic& topic) noexcept {
  // Topics live as long as their bus, so the pointer names one topic.
  if (state_ && state_->enforce && topic.impl_ != nullptr && topic.impl_ == state_->publish_ok &&
      state_->cred->version.load(std::memory_order_acquire) == state_->seen)
    return Status();
  Status s = check(kPublish, topic.name());
  if (s.ok() && state_->enforce) state_->publish_ok = topic.impl_;
  return s;
}

Status Client::publish(const Topic& topic, const OutgoingMessage& message) noexcept {
  if (Status s = check_publish(topic); !s.ok()) return s;
  return topic.publish(message);
}

Status Client::try_publish(const Topic& topic, const OutgoingMessage& message) noexcept {
  if (Status s = check_publish(topic); !s.ok()) return s;
  return topic.try_publish(message);
}

Status Client::publish_async(const Topic& topic, const OutgoingMessage& message, PublishCallback done) {
  if (Status s = check_publish(topic); !s.ok()) return s;
  return topic.publish_async(message, std::move(done));
}


Result<Subscription> Client::subscribe(const Topic& topic, std::string_view group, Handler handler,
                                       const GroupOptions& options) {
  if (Status s = check(kConsume, topic.name()); !s.ok()) return s;
  if (!options.idempotency_scope.empty())
    if (Status s = check(kConsume, options.idempotency_scope); !s.ok()) return s;
  return state_->bus->subscribe(topic, group, std::move(handler), options);
}

Result<Subscription> Client::consume(const Topic& queue, Handler handler, const GroupOptions& options) {
  if (Status s = check(kConsume, queue.name()); !s.ok()) return s;
  if (!options.idempotency_scope.empty())
    if (Status s = check(kConsume, options.idempotency_scope); !s.ok()) return s;
  return state_->bus->consume(queue, std::move(handler), options);
}

Result<Subscription> Client::subscribe_tx(const Topic& topic, std::string_view group, TxHandler handler,
                                          const GroupOptions& options) {
  if (Status s = check(kConsume, topic.name()); !s.ok()) return s;
  if (!options.idempotency_scope.empty())
    if (Status s = check(kConsume, options.idempotency_scope); !s.ok()) return s;
  return state_->bus->subscribe_tx(topic, group, std::move(handler), options);
}

Result<Subscription> Client::consume_tx(const Topic& queue, TxHandler handler, const GroupOptions& options) {
  if (Status s = check(kConsume, queue.name()); !s.ok()) return s;
  if (!options.idempotency_scope.empty())
    if (Status s = check(kConsume, options.idempotency_scope); !s.ok()) return s;
  return state_->bus->consume_tx(queue, std::move(handler), options);
}

Result<std::string> Client::table_get(std::string_view table, std::string_view key) {
  if (Status s = detail::check_name(table, "table"); !s.ok()) return s;
  if (Status s = check(kConsume, table); !s.ok()) return s;
  return state_->bus->table_get(table, key);
}

Result<IdempotencyTable*> Client::idempotency(std::string_view scope, const IdempotencyOptions& options) {
  if (Status s = detail::check_name(scope, "idempotency scope"); !s.ok()) return s;
  if (Status s = check(kConsume, scope); !s.ok()) return s;
  return state_->bus->idempotency(scope, options);
}

Result<std::vector<DlqEntry>> Client::dlq_list(const DlqFilter& filter) {
  if (!state_ || state_->bus == nullptr) return no_client();
  auto dl = state_->bus->dead_letters();
  if (!dl.ok()) return dl.status();
  auto all = (*dl)->list(filter);
  if (!all.ok() || !state_->enforce) return all;
  std::vector<DlqEntry> mine;
  for (DlqEntry& e : *all)
    if (check(kAdmin, e.topic).ok()) mine.push_back(std::move(e));
  return mine;
}

Result<DlqEntry> Client::dlq_show(std::uint64_t id) {
  if (!state_ || state_->bus == nullptr) return no_client();
  auto dl = state_->bus->dead_letters();
  if (!dl.ok()) return dl.status();
  auto e = (*dl)->show(id);
  if (!e.ok()) return e;
  if (Status s = check(kAdmin, e->topic); !s.ok()) return s;
  return e;
}

namespace {
Status check_ids(DeadLetters* dl, const std::vector<std::uint64_t>& ids,
                 const std::function<Status(std::string_view)>& chk) {
  for (std::uint64_t id : ids) {
    auto e = dl->show(id);
    if (!e.ok()) return e.status();
    if (Status s = chk(e->topic); !s.ok()) return s;
  }
  return Status();
}
}  // namespace

Result<std::uint64_t> Client::dlq_replay(const std::vector<std::uint64_t>& ids, std::string_view operator_name) {
  if (!state_ || state_->bus == nullptr) return no_client();
  auto dl = state_->bus->dead_letters();
  if (!dl.ok()) return dl.status();
  if (Status s = check_ids(*dl, ids, [this](std::string_view t) { return check(kAdmin, t); }); !s.ok())
    return s;
  return (*dl)->replay(ids, operator_name);
}

Status Client::dlq_archive(const std::vector<std::uint64_t>& ids, std::string_view operator_name) {
  if (!state_ || state_->bus == nullptr) return no_client();
  auto dl = state_->bus->dead_letters();
  if (!dl.ok()) return dl.status();
  if (Status s = check_ids(*dl, ids, [this](std::string_view t) { return check(kAdmin, t); }); !s.ok())
    return s;
  return (*dl)->archive(ids, operator_name);
}

Result<std::uint64_t> Client::dlq_purge(const std::vector<std::uint64_t>& ids, std::string_view operator_name) {
  if (!state_ || state_->bus == nullptr) return no_client();
  auto dl = state_->bus->dead_letters();
  if (!dl.ok()) return dl.status();
  if (Status s = check_ids(*dl, ids, [this](std::string_view t) { return check(kAdmin, t); }); !s.ok())
    return s;
  return (*dl)->purge(ids, operator_name);
}

}  // namespace lanebus
