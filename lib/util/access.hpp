// lanebus — MIT License.
// detail::Access: the one friend of the public classes, through which lib/ and
// the tests reach what the public headers keep private (implementations,
// library-only constructors, the dispatcher's MessageView fields, test hooks).
// Internal: not installed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "lanebus/bus.hpp"
#include "lanebus/dlq.hpp"
#include "lanebus/fence.hpp"
#include "lanebus/idempotency.hpp"
#include "lanebus/lease.hpp"
#include "lanebus/message.hpp"
#include "lanebus/tenancy.hpp"
#include "lanebus/record.hpp"
#include "lanebus/transaction.hpp"

namespace lanebus::detail {

class IdempotencyImpl;
struct UsageTap;
class LeaseTableImpl;
class BusCore;
struct TxnState;

struct Access {
  // ---- library use ----
  static BusCore* core(const Bus& bus) noexcept { return bus.core_.get(); }
  static IdempotencyImpl* impl(const IdempotencyTable& table) noexcept { return table.impl_.get(); }
  static LeaseTableImpl& impl(LeaseTable& table) noexcept { return *table.impl_; }
  static Transaction transaction(TxnState* state) noexcept { return Transaction(state); }
  static std::unique_ptr<DeadLetters> dead_letters(BusCore* core) {
    return std::unique_ptr<DeadLetters>(new DeadLetters(core));
  }
  static std::unique_ptr<Namespaces> namespaces(BusCore* core) {
    return std::unique_ptr<Namespaces>(new Namespaces(core));
  }
  static void set_attempt(MessageView& view, std::uint32_t attempt) noexcept { view.attempt_override_ = attempt; }
  /// Point a view at the next message of a plain run (ephemeral_lane.cpp):
  /// only the fields that differ between its messages are written.
  static void rebind(MessageView& view, const MessageHeader& header, std::string_view key,
                     std::string_view idempotency_key, std::string_view payload, std::uint32_t lane) noexcept {
    view.header_ = &header;
    view.key_ = key;
    view.idempotency_key_ = idempotency_key;
    view.payload_ = payload;
    view.lane_ = lane;
  }
  static void set_deadline_ns(MessageView& view, std::int64_t deadline_ns) noexcept {
    view.deadline_ns_ = deadline_ns;
  }
  /// `headers`: a checked stored header block (lib/util/header_block.hpp), or empty.
  static void set_headers(MessageView& view, std::string_view headers) noexcept { view.headers_ = headers; }
  /// A record view read through a reader schema (`fields`: its field list),
  /// counting reads into `tap` as writer version `version` (nullptr: none).
  /// A view of a record checked before (at publish): only the magic byte is
  /// looked at; reads stay bounds-checked (doc/schemas.md, "Validation").
  static RecordView trusted(std::string_view bytes) noexcept {
    RecordView v;
    v.body_ = bytes.substr(1);
    return v;
  }
  static RecordView with_schema(RecordView v, const SchemaVersion* schema, const void* fields, UsageTap* tap,
                                std::uint16_t version) noexcept {
    v.schema_ = schema;
    v.fields_ = fields;
    v.tap_ = tap;
    v.version_ = version;
    return v;
  }
  static const FenceConfirm& confirm(const FencedResource& fence) noexcept { return fence.confirm_; }
  static bool check_enabled(const FencedResource& fence) noexcept { return fence.check_enabled_; }

  /// The schema registry's clock (deprecation windows, usage day buckets,
  /// audit times): ns since the epoch; an empty function = the wall clock.
  static void set_schema_clock_for_testing(Bus& bus, std::function<std::int64_t()> clock);

  // ---- test hooks (negative controls; never used by lib/ itself) ----
  /// false turns the fence check of `fence` off: every token is accepted and
  /// the HWM is neither read nor written, so a test can show that a stale
  /// write gets through without the fence (proof that the test can fail).
  static void set_check_enabled_for_testing(FencedResource& fence, bool on) noexcept { fence.check_enabled_ = on; }
};

}  // namespace lanebus::detail
