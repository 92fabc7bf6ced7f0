// lanebus — MIT License.
// StoreTxn, and the calls that hand one to extension code (write, write_async, read).
#include "durable_store.hpp"

#include <utility>

#include "delayed_index.hpp"
#include "durable_store_impl.hpp"
#include "quote.hpp"

namespace lanebus::detail {

Result<std::string_view> StoreTxn::get(StoreTable table, std::string_view key) {
  const int t = static_cast<int>(table);
  if (!store_->ext_present_[t]) return Status(Code::NotFound);
  if (ctx_) return static_cast<DurableStore::WriteCtx*>(ctx_)->get(store_->dbi_ext_[t], key);
  return txn_->get(store_->dbi_ext_[t], key);
}

Status StoreTxn::put(StoreTable table, std::string_view key, std::string_view value) {
  if (!ctx_) return Status(Code::InvalidArgument, "put in a read transaction");
  return static_cast<DurableStore::WriteCtx*>(ctx_)->put(store_->dbi_ext_[static_cast<int>(table)], key, value);
}

Result<char*> StoreTxn::reserve_new(StoreTable table, std::string_view key, std::size_t size, bool append) {
  if (!ctx_) return Status(Code::InvalidArgument, "put in a read transaction");
  return static_cast<DurableStore::WriteCtx*>(ctx_)->reserve_new(store_->dbi_ext_[static_cast<int>(table)], key, size,
                                                                  append);
}

Status StoreTxn::del(StoreTable table, std::string_view key) {
  if (!ctx_) return Status(Code::InvalidArgument, "del in a read transaction");
  return static_cast<DurableStore::WriteCtx*>(ctx_)->del(store_->dbi_ext_[static_cast<int>(table)], key);
}

Status StoreTxn::scan(StoreTable table, std::string_view from, std::string_view prefix,
                      const std::function<bool(std::string_view, std::string_view)>& visit) {
  const int t = static_cast<int>(table);
  if (!store_->ext_present_[t]) return Status();
  return scan_dbi(store_->dbi_ext_[t], from, prefix, visit);
}

Status StoreTxn::abort_batch(Status cause) {
  if (cause.ok()) cause = Status(Code::Internal, "abort_batch without a cause");
  if (ctx_) return static_cast<DurableStore::WriteCtx*>(ctx_)->fail(std::move(cause));
  return cause;
}

LmdbDbi StoreTxn::core_dbi(Core table) const noexcept {
  switch (table) {
    case Core::Meta: return store_->dbi_meta_;
    case Core::Topics: return store_->dbi_topics_;
    case Core::Lanes: return store_->dbi_lanes_;
    case Core::Log: return store_->dbi_log_;
    case Core::Groups: return store_->dbi_groups_;
    case Core::Cursors: return store_->dbi_cursors_;
    case Core::Inflight: return store_->dbi_inflight_;
  }
  return store_->dbi_meta_;
}

Result<std::string_view> StoreTxn::core_get(Core table, std::string_view key) {
  if (ctx_) return static_cast<DurableStore::WriteCtx*>(ctx_)->get(core_dbi(table), key);
  return txn_->get(core_dbi(table), key);
}

Status StoreTxn::core_put(Core table, std::string_view key, std::string_view value) {
  if (!ctx_) return Status(Code::InvalidArgument, "put in a read transaction");
  return static_cast<DurableStore::WriteCtx*>(ctx_)->put(core_dbi(table), key, value);
}

Status StoreTxn::core_del(Core table, std::string_view key) {
  if (!ctx_) return Status(Code::InvalidArgument, "del in a read transaction");
  return static_cast<DurableStore::WriteCtx*>(ctx_)->del(core_dbi(table), key);
}

Status StoreTxn::core_scan(Core table, std::string_view from, std::string_view prefix,
                           const std::function<bool(std::string_view, std::string_view)>& visit) {
  return scan_dbi(core_dbi(table), from, prefix, visit);
}

Status StoreTxn::scan_dbi(LmdbDbi dbi, std::string_view from, std::string_view prefix,
                          const std::function<bool(std::string_view, std::string_view)>& visit) {
  Status result;
  {
    auto c = LmdbCursor::open(*txn_, dbi, store_->options_.directory);
    if (!c.ok()) return c.status();
    auto found = from.empty() ? c->first() : c->seek(from);  // LMDB refuses an empty key
    while (found.ok() && *found) {
      std::string_view k = c->key(), v = c->value();
      if (k.substr(0, prefix.size()) != prefix) break;
      if (!visit(k, v)) break;
      found = c->next();
    }
    if (!found.ok()) result = found.status();
  }
  if (!result.ok() && ctx_) (void)static_cast<DurableStore::WriteCtx*>(ctx_)->fail(result);
  return result;
}

Status StoreTxn::sweep(StoreTable table,
                       const std::function<Sweep(std::string_view, std::string_view)>& visit) {
  if (!ctx_) return Status(Code::InvalidArgument, "sweep in a read transaction");
  const int t = static_cast<int>(table);
  if (!store_->ext_present_[t]) return Status();
  Status result;
  {
    auto c = LmdbCursor::open(*txn_, store_->dbi_ext_[t], store_->options_.directory);
    if (!c.ok()) return c.status();
    auto found = c->first();
    while (found.ok() && *found) {
      const Sweep step = visit(c->key(), c->value());
      if (step == Sweep::Stop) break;
      if (step == Sweep::Delete) {
        // The cursor is left on the entry after the deleted one: LMDB's next
        // returns that one (mdb_cursor_next after a delete).
        if (Status d = c->del(); !d.ok()) {
          result = d;
          break;
        }
      }
      found = c->next();
    }
    if (result.ok() && !found.ok()) result = found.status();
  }
  if (!result.ok()) (void)static_cast<DurableStore::WriteCtx*>(ctx_)->fail(result);
  return result;
}

Result<AppendResult> StoreTxn::append_borrowed(AppendRequest& request) {
  if (!ctx_) return Status(Code::InvalidArgument, "append in a read transaction");
  DurableStore::WriteOp op;
  op.is_append = true;
  op.request = std::move(request);
  Status s = store_->log_->apply_append(*static_cast<DurableStore::WriteCtx*>(ctx_), op);
  request = std::move(op.request);  // apply_append keeps nothing of it
  if (!s.ok()) return s;
  return op.result;
}

Result<AppendResult> StoreTxn::append(AppendRequest request) { return append_borrowed(request); }

Status StoreTxn::commit_offset(const GroupRef& group, std::uint32_t lane, std::uint64_t offset) {
  if (!ctx_) return Status(Code::InvalidArgument, "commit_offset in a read transaction");
  return store_->groups_->commit_offset_in(*static_cast<DurableStore::WriteCtx*>(ctx_), group, lane, offset);
}

Status StoreTxn::ack(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt) {
  if (!ctx_) return Status(Code::InvalidArgument, "ack in a read transaction");
  return store_->claims_->ack_in(*static_cast<DurableStore::WriteCtx*>(ctx_), group, lane, offset, attempt);
}

Status StoreTxn::release(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt,
                         std::int64_t delay_ns) {
  if (!ctx_) return Status(Code::InvalidArgument, "release in a read transaction");
  return store_->claims_->release_in(*static_cast<DurableStore::WriteCtx*>(ctx_), group, lane, offset, attempt,
                            now_ns_ + delay_ns, false);
}

Status StoreTxn::unclaim(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt) {
  if (!ctx_) return Status(Code::InvalidArgument, "unclaim in a read transaction");
  return store_->claims_->release_in(*static_cast<DurableStore::WriteCtx*>(ctx_), group, lane, offset, attempt, now_ns_, true);
}

Status StoreTxn::expire_claim(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt) {
  if (!ctx_) return Status(Code::InvalidArgument, "expire_claim in a read transaction");
  return store_->claims_->release_in(*static_cast<DurableStore::WriteCtx*>(ctx_), group, lane, offset, attempt, now_ns_, false);
}

}  // namespace lanebus::detail
