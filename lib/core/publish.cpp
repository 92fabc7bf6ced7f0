// lanebus — MIT License.
// The publish path: ephemeral slots and rings with backpressure (durable
// topics: publish_durable.cpp).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cassert>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bus_impl.hpp"
#include "hash.hpp"

namespace lanebus::detail {

namespace {
// A topic's slot capacity: a power of two, at least 2.
std::uint32_t round_pow2(std::uint32_t v) { return std::bit_ceil(std::max<std::uint32_t>(v, 2)); }
// The slot's key_len and idem_len are 16 bits (message_pool.hpp).
Status key_too_long() noexcept {
  return Status::from_literal(Code::PayloadTooLarge,
                              "publish: the key or idempotency key exceeds 65535 bytes (the limit of an "
                              "in-memory topic's slot)");
}
// TopicImpl::objects_only (typed.cpp).
Status bytes_to_typed() noexcept {
  return Status::from_literal(Code::InvalidArgument,
                              "publish: the topic carries typed objects; publish through its TypedTopic<T>");
}
}  // namespace

TopicImpl::TopicImpl(BusCore* b, std::string n, bool queue, const TopicOptions& o)
    : bus(b),
      name(std::move(n)),
      is_queue(queue),
      options(o),
      durable(o.durable),
      // Durable topics keep messages in the store, not in slots.
      capacity(o.durable ? 2 : round_pow2(o.capacity)),
      pool(capacity, o.durable ? 1 : o.slot_bytes),
      groups(new std::atomic<GroupImpl*>[o.max_groups]),
      lane_load(new LaneLoad[o.lanes]),
      default_ttl_ns(o.default_ttl.count()) {
  for (std::uint32_t i = 0; i < o.max_groups; ++i) groups[i].store(nullptr, std::memory_order_relaxed);
  pool.attach_payloads(b->payloads());
}

// ---------------------------------------------------------------- backpressure

// The topic's backpressure (Block / FailFast / DropOldest) around any
// resource publish needs: a message slot (acquire_slot) or a payload block
// (acquire_block, large_payload.cpp's payloads).
/// `take()` returns the resource or `none`; DropOldest drops queued messages
/// (freeing their slots and blocks) and takes again.
template <typename Take, typename T>
T TopicImpl::acquire_room(std::uint32_t lane, bool may_block, Take take, T none) noexcept {
  T s = take();
  if (s != none) return s;
  switch (options.backpressure) {
    case Backpressure::FailFast:
      return none;
    case Backpressure::DropOldest: {
      // A drop frees a slot (and its block) unless another group or a worker still holds the
      // message; keep dropping (bounded by the pool size) until one is free.
      for (std::uint32_t tries = 0; tries <= capacity; ++tries) {
        if (!drop_oldest(lane)) break;
        if ((s = take()) != none) return s;
      }
      if ((s = take()) != none) return s;
      if (!may_block) return none;
      [[fallthrough]];
    }
    case Backpressure::Block: {
      if (!may_block) return none;
      // Workers free slots in batches within microseconds: spin, then yield,
      // then sleep in short steps until the deadline. The deadline is taken
      // when the spinning ends, not on entry: a clock read costs 80-100 ns on
      // a VM (perf: a third of a blocked publisher's time), more than the
      // spin usually lasts; block_timeout is then late by the spin (< 50 µs).
      std::chrono::steady_clock::time_point deadline{};
      for (std::uint32_t spin = 0;; ++spin) {
        if ((s = take()) != none) return s;
        if (bus->closing()) return none;
        if (spin < 256) {
          cpu_relax();
        } else if (spin < 2048) {
          if (spin == 256) deadline = std::chrono::steady_clock::now() + options.block_timeout;
          std::this_thread::yield();
        } else {
          if (std::chrono::steady_clock::now() >= deadline) return none;
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    }
  }
  return none;
}


std::uint32_t TopicImpl::acquire_block(std::size_t n, std::uint32_t lane, bool may_block) noexcept {
  PayloadPool& blocks = *bus->payloads();
  return acquire_room(lane, may_block, [&blocks, n] { return blocks.try_alloc(n); }, PayloadPool::kNil);
}

bool TopicImpl::drop_oldest(std::uint32_t first_lane) noexcept {
  bool dropped_any = false;
  std::uint32_t ng = group_count.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < options.lanes; ++i) {
    std::uint32_t lane = (first_lane + i) % options.lanes;
    for (std::uint32_t gi = 0; gi < ng; ++gi) {
      GroupImpl* g = groups[gi].load(std::memory_order_acquire);
      if (g == nullptr) continue;
      GroupLane& gl = *g->lanes[lane];
      std::uint32_t idx;
      if (gl.ring.try_dequeue(idx)) {
        gl.dropped.fetch_add(1, std::memory_order_relaxed);
        pool.release(pool.at(idx));
        dropped_any = true;
      }
    }
    if (dropped_any) return true;
  }
  return false;
}

Slot* TopicImpl::acquire_slot(std::uint32_t lane, bool may_block) noexcept {
  // The waiting itself is shared with the payload blocks (acquire_room, above).
  return acquire_room(lane, may_block, [this] { return pool.try_alloc(); }, static_cast<Slot*>(nullptr));
}

// Typed topics (doc/schemas.md): the record must match the latest schema
// version; *version is the version stamped on the message. Untyped topics:
// one atomic load.
Status TopicImpl::check_schema(const OutgoingMessage& m, std::uint16_t* version) noexcept {
  *version = m.schema_version;
  const SchemaVersion* sv = schema.load(std::memory_order_acquire);
  if (sv == nullptr) return Status();
  Status st = bus->schemas()->check_publish(this, sv, m.payload, m.schema_version, version);
  if (!st.ok()) refused.fetch_add(1, std::memory_order_relaxed);
  return st;
}

namespace {
// fill_slot (the slot's keys, header and payload) is in delayed.hpp, shared with the timed publish.

Status shut_down() noexcept { return Status::from_literal(Code::ShutDown, "publish: the bus is shut down"); }

/// Solo ownership ("Solo publishers", bus_impl.hpp): claim an unowned topic
/// for publisher slot `slot`, and open its in_push window. True: the window
/// is open and `t` is ours (append solo, then close_window). False: the topic
/// is shared now (made so if it had another owner).
bool open_window_slow(TopicImpl& t, std::uint32_t slot) noexcept;
inline bool open_window(TopicImpl& t, std::uint32_t slot) noexcept {
  // A stream: the topic is ours already.
  const std::uintptr_t tag = std::uintptr_t{slot} + 2;
  if (t.owner.load(std::memory_order_relaxed) == tag) [[likely]] {
    PublisherSlot& ps = t.bus->publisher_slot(slot);
    ps.in_push.store(1, std::memory_order_relaxed);
    AsymmetricFence::light();  // the window, then the owner: make_shared runs the heavy fence
    // acquire: after a lend (lend_to_timer), the timer's appends happen before ours.
    if (t.owner.load(std::memory_order_acquire) == tag) [[likely]] return true;
    ps.in_push.store(0, std::memory_order_release);
  }
  return open_window_slow(t, slot);
}

/// Spin (then yield) until `done()`: the short waits of the solo hand-offs.
template <class Done>
void spin_until(Done&& done) noexcept {
  for (std::uint32_t spin = 0; !done(); ++spin) {
    if (spin < 128) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}

/// Wait while the timer has borrowed the topic from `tag` (or from nobody:
/// 0) and return the owner after; any other value at once.
std::uintptr_t wait_lent(const TopicImpl& t, std::uintptr_t tag) noexcept {
  std::uintptr_t o;
  spin_until([&] {
    o = t.owner.load(std::memory_order_acquire);
    return o != (tag | TopicImpl::kLent) && o != TopicImpl::kLent;
  });
  return o;
}

bool open_window_slow(TopicImpl& t, std::uint32_t slot) noexcept {
  const std::uintptr_t tag = std::uintptr_t{slot} + 2;
  // Lent from us or from nobody: the timer gives it back after a few routes.
  std::uintptr_t o = wait_lent(t, tag);
  if (o == 0 && t.owner.compare_exchange_strong(o, tag, std::memory_order_acq_rel, std::memory_order_relaxed)) {
    o = tag;
    if (!t.ever_solo.load(std::memory_order_relaxed)) {
      // The first solo claim: every worker that lets go of a lane of this
      // topic from now on sees ever_solo and runs the heavy fence; one that
      // read it false did so before this fence, so we see its flag store.
      t.ever_solo.store(true, std::memory_order_seq_cst);
      AsymmetricFence::heavy();
    }
  }
  if (o == tag) {
    PublisherSlot& ps = t.bus->publisher_slot(slot);
    ps.in_push.store(1, std::memory_order_relaxed);
    AsymmetricFence::light();  // the window, then the owner: make_shared runs the heavy fence
    if (t.owner.load(std::memory_order_acquire) == tag) return true;
    ps.in_push.store(0, std::memory_order_release);
    // Lent meanwhile: try again once it is back.
    if (t.owner.load(std::memory_order_acquire) == (tag | TopicImpl::kLent)) return open_window_slow(t, slot);
  }
  t.share();
  return false;
}

/// Close the window opened by open_window: our appends happen before make_shared's wait ends.
void close_window(TopicImpl& t, std::uint32_t slot) noexcept {
  t.bus->publisher_slot(slot).in_push.store(0, std::memory_order_release);
}

/// Wait for `in_push` of a publisher slot to drop (a solo publish in flight).
void wait_window(const PublisherSlot& ps) noexcept {
  spin_until([&] { return ps.in_push.load(std::memory_order_acquire) == 0; });
}
}  // namespace

Status TopicImpl::no_slot(bool may_block) noexcept {
  if (bus->closing()) return shut_down();
  refused.fetch_add(1, std::memory_order_relaxed);
  if (may_block && options.backpressure != Backpressure::FailFast)
    return Status::from_literal(Code::TimedOut, "publish: the topic stayed full for its whole block_timeout");
  return Status::from_literal(Code::WouldBlock, "publish: the topic is full (all capacity slots in use)");
}

namespace {
/// Wait while another publisher makes the topic shared (make_shared): until
/// the old owner's window has closed and `owner` is 1.
void wait_shared(const TopicImpl& t) noexcept {
  spin_until([&] { return t.owner.load(std::memory_order_acquire) == 1; });
}
}  // namespace

void TopicImpl::make_shared() noexcept {
  std::uintptr_t o = owner.load(std::memory_order_acquire);
  while (o != 1) {
    // Another publisher is making it shared: 1 only once the old owner's window has closed.
    if (o == kSharing) return wait_shared(*this);
    // kSharing, not 1, while we wait: a publisher that reads 1 appends shared
    // at once, which it may do only after the old owner's last solo append
    // (an append at a tail the owner holds in a register corrupts the ring).
    if (!owner.compare_exchange_weak(o, kSharing, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // Lent (lend_to_timer): the timer's appends are shared ones already.
    if ((o & ~kLent) >= 2) {
      // The old owner either sees owner != its tag at its next re-check, or
      // its window is open and visible here: wait for it to close (asym_fence.hpp).
      AsymmetricFence::heavy();
      wait_window(bus->publisher_slot(static_cast<std::uint32_t>((o & ~kLent) - 2)));
    }
    // release: the old owner's appends (seen through its window's close) happen before any shared one.
    owner.store(1, std::memory_order_release);
    return;
  }
}

std::uintptr_t TopicImpl::lend_to_timer() noexcept {
  std::uintptr_t o = owner.load(std::memory_order_acquire);
  for (;;) {
    if (o == 1) return 1;  // shared: nothing to lend
    if (o == kSharing) {   // being made shared: shared once the old owner's window closed
      wait_shared(*this);
      return 1;
    }
    // Never lent twice: the timer is the one borrower, and it gives back first.
    if (owner.compare_exchange_weak(o, o | kLent, std::memory_order_acq_rel, std::memory_order_acquire)) break;
  }
  if (o >= 2) {
    // As make_shared: the owner sees the mark at its next re-check, or its
    // window is open and visible here; after the wait its appends are ours to see.
    AsymmetricFence::heavy();
    wait_window(bus->publisher_slot(static_cast<std::uint32_t>(o - 2)));
  }
  return o;
}

void TopicImpl::give_back(std::uintptr_t lent) noexcept {
  if (lent == 1) return;
  // release: our appends happen before the owner's next solo ones. Fails
  // only when another publisher made the topic shared meanwhile (for good).
  std::uintptr_t expected = lent | kLent;
  owner.compare_exchange_strong(expected, lent, std::memory_order_acq_rel, std::memory_order_relaxed);
}

inline void TopicImpl::schedule(GroupLane* gl) noexcept {
  // The check Scheduler::schedule starts with, without the call when the lane
  // is scheduled already (a lane being drained, mostly).
  if (gl->scheduled.load(std::memory_order_seq_cst)) return;
  bus->scheduler().schedule(gl);
}

// A topic with one active group (the common case): route's work without its
// loop and target array. Anything else, and a group gone or inactive: route.
inline bool TopicImpl::route_one(Slot* s, std::uint32_t lane, bool solo) noexcept {
  if (group_count.load(std::memory_order_acquire) != 1) [[unlikely]] return route(s, lane, solo);
  GroupImpl* const g = groups[0].load(std::memory_order_acquire);
  if (g == nullptr || !g->active.load(std::memory_order_acquire)) [[unlikely]] return route(s, lane, solo);
  GroupLane* const gl = g->lanes[lane].get();
  std::atomic<std::uint64_t>& published = lane_load[lane].published;
  // relaxed: the ring push below (release) publishes the count with the slot.
  s->refs.store(1, std::memory_order_relaxed);
  const std::uint32_t index = pool.index_of(s);
  if (solo) {
    // The only writer while the topic is solo (make_shared waits for us).
    published.store(published.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    gl->ring.push_solo(index);
    AsymmetricFence::light();  // the entry, then the flag (as route)
  } else {
    published.fetch_add(1, std::memory_order_relaxed);
    while (!gl->ring.try_enqueue(index)) std::this_thread::yield();  // as route
  }
  schedule(gl);
  return true;
}

bool TopicImpl::route(Slot* s, std::uint32_t lane, bool solo, std::uint32_t refs_set) noexcept {
  // Route to every active group. The slot's reference count must be final
  // before the first ring push makes it visible, so collect the targets first
  // (a group deactivated meanwhile still drains its rings, so a stale target
  // is harmless). More groups than fit the local array: guard-reference path.
  constexpr std::uint32_t kInline = 16;
  GroupLane* targets[kInline];
  std::uint32_t n = 0;
  bool overflow = false;
  const std::uint32_t ng = group_count.load(std::memory_order_acquire);
  for (std::uint32_t gi = 0; gi < ng; ++gi) {
    GroupImpl* g = groups[gi].load(std::memory_order_acquire);
    if (g == nullptr || !g->active.load(std::memory_order_acquire)) continue;
    if (n == kInline) {
      overflow = true;
      break;
    }
    targets[n++] = g->lanes[lane].get();
  }
  std::atomic<std::uint64_t>& published = lane_load[lane].published;
  if (solo) {
    // The only writer while the topic is solo (make_shared waits for us).
    published.store(published.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  } else {
    published.fetch_add(1, std::memory_order_relaxed);
  }
  if (n == 0) {
    unrouted.fetch_add(1, std::memory_order_relaxed);
    pool.free(s);
    return false;
  }
  const std::uint32_t index = pool.index_of(s);
  // The ring holds at most `capacity` entries and every entry pins a live
  // slot, so it cannot be full; a failed try only means a dequeuer of the
  // cell we need has not finished its store yet.
  auto push = [&](GroupLane* gl) {
    if (solo) {
      gl->ring.push_solo(index);
      // The entry, then the flag (the Dekker hand-off with let_go, which
      // runs the heavy fence for a topic that was ever solo).
      AsymmetricFence::light();
    } else {
      while (!gl->ring.try_enqueue(index)) std::this_thread::yield();
    }
    schedule(gl);
  };
  if (!overflow) {
    // relaxed: the ring push below (release) publishes the count with the
    // slot (a count set by the publish reaches this thread through the
    // delay queue's ring: release, then acquire).
    if (n != refs_set) s->refs.store(n, std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < n; ++i) push(targets[i]);
    return true;
  }
  s->refs.store(1, std::memory_order_relaxed);  // the publisher's guard
  for (std::uint32_t gi = 0; gi < ng; ++gi) {
    GroupImpl* g = groups[gi].load(std::memory_order_acquire);
    if (g == nullptr || !g->active.load(std::memory_order_acquire)) continue;
    s->refs.fetch_add(1, std::memory_order_relaxed);  // relaxed: we still hold the guard
    push(g->lanes[lane].get());
  }
  pool.release(s);  // drop the guard
  return true;
}

Status TopicImpl::publish(const OutgoingMessage& m, bool may_block, std::uint64_t id,
                          const PayloadFill* fill) noexcept {
  // A due time or an expiry: the slot carries an extension block (delayed.cpp).
  if (has_times(m, default_ttl_ns)) [[unlikely]] return timed.publish(m, may_block, id, fill);
  share();
  if (m.payload.empty() && fill == nullptr)
    return Status::from_literal(Code::InvalidArgument, "publish: the payload is empty");
  // relaxed: a flag set once by create_topic<T>, before the typed handle that
  // publishes objects exists; nothing else is read through it.
  if (fill == nullptr && objects_only.load(std::memory_order_relaxed)) return bytes_to_typed();
  // Untyped topics skip the out-of-line check (doc/performance.md).
  std::uint16_t schema_version = m.schema_version;
  if (schema.load(std::memory_order_relaxed) != nullptr) {
    if (Status st = check_schema(m, &schema_version); !st.ok()) return st;
  }
  if ((m.key.size() | m.idempotency_key.size()) > Slot::kMaxKeyBytes) return key_too_long();
  std::size_t need = m.key.size() + m.idempotency_key.size() + (fill ? fill->size : m.payload.size());
  // Beyond the slot, or a typed object: large_payload.cpp.
  const bool large = need > options.slot_bytes || fill != nullptr;
  if (large) {
    if (Status st = check_large(*this, m, fill); !st.ok()) return st;
  }
  if (bus->closing()) return shut_down();

  // Tenancy: the namespace's publish quota and usage (lib/features/tenancy.hpp).
  NamespaceState* const nsp = ns.load(std::memory_order_acquire);
  if (Status q = nsp->admit_publish(need, may_block && options.backpressure == Backpressure::Block,
                                    options.block_timeout);
      !q.ok())
    return q;

  const std::uint32_t lane = lane_for_key(m.key, options.lanes);
  Slot* s = pool.try_alloc();  // a free slot (the common case) without the out-of-line call
  if (s == nullptr) s = acquire_slot(lane, may_block);
  if (s == nullptr) {
    nsp->unadmit_publish(need);
    return no_slot(may_block);
  }
  // try_alloc incremented the pool's in_use (seq_cst); shutdown sets closing
  // and then waits on in_use, so either we see closing here or it waits for us.
  if (bus->closing()) {
    pool.free(s);
    nsp->unadmit_publish(need);
    return shut_down();
  }
  fill_slot(s, m, lane, id, now_ns(), schema_version, !large);
  if (large) {
    if (Status st = place_large(*this, s, m, fill, lane, may_block); !st.ok()) {
      pool.free(s);
      nsp->unadmit_publish(need);
      return st;
    }
  }
  route(s, lane, false);
  return Status();
}

bool TopicImpl::enter_solo(const PublisherState* p) noexcept {
  if (p != nullptr && p->slot != kNoPublisherSlot && p->asym) return open_window(*this, p->slot);  // false: made shared
  share();
  return false;
}

void TopicImpl::leave_solo(const PublisherState* p) noexcept { close_window(*this, p->slot); }

void TopicImpl::route_due(PublisherState* p, Slot* const* slots, std::uint32_t n) noexcept {
  const bool solo = enter_solo(p);
  for (std::uint32_t i = 0; i < n; ++i) route(slots[i], slots[i]->lane, solo);
  if (solo) leave_solo(p);
}

// ---------------------------------------------------------------- publish_via
//
// Two frames (doc/performance.md, sixth round). publish_via is the lean one:
// bytes that fit the slot, no due time, expiry, headers or trace context, an
// untyped topic in a namespace without a publish quota, through the
// publisher's last link while it has a publisher slot and membarrier. It
// checks all of that up front, before it has changed anything, and hands
// anything else (and a magazine that cannot refill) to publish_via_general,
// which serves every case. Both end in the same slot contents, counters and
// ring appends; only the order of the checks differs, and none of them has an
// effect before the slot is taken.
Status TopicImpl::publish_via(PublisherState& p, const OutgoingMessage& m, bool may_block,
                              const PayloadFill* fill) noexcept {
  PublisherLink* const lp = p.last_link;
  const std::size_t keys = m.key.size() + m.idempotency_key.size();
  const std::size_t need = keys + (fill == nullptr ? m.payload.size() : fill->size);
  // Bytes that fit the slot, or a typed object (TypedTopic<T>) constructed
  // in it; anything else takes the general path. (A key beyond kMaxKeyBytes
  // fits a slot of more than 64 KiB: the general path refuses it.)
  if (lp == nullptr || lp->topic != this || p.slot == kNoPublisherSlot || !p.asym ||
      (m.key.size() | m.idempotency_key.size()) > Slot::kMaxKeyBytes ||
      (fill == nullptr ? m.payload.empty() || need > options.slot_bytes || objects_only.load(std::memory_order_relaxed)
                       : inline_object_offset(keys, *fill, options.slot_bytes) == 0 ||
                             schema.load(std::memory_order_relaxed) != nullptr)) [[unlikely]]
    return publish_via_general(p, m, may_block, fill);
  // A due time or an expiry (delayed.cpp), with this link's magazine: as
  // publish_via_general would, without its link search.
  if (has_times(m, default_ttl_ns)) [[unlikely]] return timed.publish(m, may_block, p.take_id(), fill, &p, &lp->mag);
  // A topic with a schema (doc/schemas.md) checks the record first.
  std::uint16_t schema_version = m.schema_version;
  if (schema.load(std::memory_order_relaxed) != nullptr) [[unlikely]] {
    if (Status st = check_schema(m, &schema_version); !st.ok()) return st;
  }
  // A namespace with a publish quota: this thread's credit admits the
  // message (doc/tenancy.md), and it is counted in the publisher's tally below.
  NamespaceState* const nsp = ns.load(std::memory_order_acquire);
  const bool limited = nsp->pub_limited.load(std::memory_order_relaxed);
  if (limited) [[unlikely]] {
    if (Status q = nsp->admit_credit(need, may_block && options.backpressure == Backpressure::Block,
                                     options.block_timeout);
        !q.ok())
      return q;
  }
  // Shutdown: read once, after the slot is taken (the Dekker below); a slot
  // taken while closing goes back to the pool.
  Slot* const s = pool.take(lp->mag);  // plain loads and stores unless the magazine refills
  // No slot in hand: the general path refills or waits under the topic's
  // backpressure (and admits the message itself).
  if (s == nullptr) [[unlikely]] {
    if (limited) nsp->give_back_credit(need);
    return publish_via_general(p, m, may_block, fill);
  }
  // The slot counts in in_use now; then read closing (shutdown's Dekker, as below).
  AsymmetricFence::light();
  if (bus->closing()) [[unlikely]] {
    pool.free(s);
    if (limited) nsp->give_back_credit(need);
    return shut_down();
  }
  lp->mag.note_lines(need);
  const std::uint32_t lane = lane_of(m.key);
  fill_slot(s, m, lane, p.take_id(), now_ns(), schema_version, fill == nullptr);
  if (fill != nullptr) [[unlikely]] {
    if (!place_payload(s, bus->payloads(), PayloadPool::kNil, m.payload, fill, options.slot_bytes)) {
      pool.free(s);
      if (limited) nsp->give_back_credit(need);
      return Status::from_literal(Code::InvalidArgument,
                                  "publish: constructing the typed object in the slot threw (nothing published)");
    }
  }
  const bool solo = open_window(*this, p.slot);  // "Solo publishers", bus_impl.hpp
  route_one(s, lane, solo);
  if (solo) close_window(*this, p.slot);
  nsp->count_in_slot(p.slot, 1, need);
  return Status();
}

Status TopicImpl::publish_via_general(PublisherState& p, const OutgoingMessage& m, bool may_block,
                                      const PayloadFill* fill) noexcept {
  const std::uint64_t id = p.take_id();
  PublisherLink* const lp = p.link(this);
  if (lp == nullptr) [[unlikely]] return publish(m, may_block, id, fill);
  PublisherLink& link = *lp;
  NamespaceState* const nsp = ns.load(std::memory_order_acquire);
  // A publisher without a slot (more than kPublisherSlots at once) takes
  // the shared path, and so do a typed object on a topic with a schema and
  // bytes to a topic of typed objects (publish refuses them). A payload
  // beyond the slot takes a block of the payload pool here; a typed object
  // is constructed in the slot or in such a block.
  const std::size_t keys = m.key.size() + m.idempotency_key.size();
  const std::size_t need = keys + (fill != nullptr ? fill->size : m.payload.size());
  // (A key beyond kMaxKeyBytes fits a slot of more than 64 KiB: the shared
  // path refuses it.)
  // A due time or an expiry: delayed.cpp, with this publisher's magazine.
  if (has_times(m, default_ttl_ns)) [[unlikely]] return timed.publish(m, may_block, id, fill, &p, &link.mag);
  if (p.slot == kNoPublisherSlot || (m.key.size() | m.idempotency_key.size()) > Slot::kMaxKeyBytes ||
      (fill == nullptr ? objects_only.load(std::memory_order_relaxed)
                       : schema.load(std::memory_order_relaxed) != nullptr))
    return publish(m, may_block, id, fill);
  if (fill == nullptr && m.payload.empty())
    return Status::from_literal(Code::InvalidArgument, "publish: the payload is empty");
  // A topic with a schema checks the record here, not on the shared path
  // (a topic published to there is shared for good).
  std::uint16_t schema_version = m.schema_version;
  if (schema.load(std::memory_order_relaxed) != nullptr) {
    if (Status st = check_schema(m, &schema_version); !st.ok()) return st;
  }
  // Bytes beyond the slot, or an object that does not fit it: a block of
  // the payload pool (large_payload.cpp), also here rather than shared.
  const bool large = fill == nullptr ? need > options.slot_bytes : inline_object_offset(keys, *fill, options.slot_bytes) == 0;
  if (large) {
    if (Status st = check_large(*this, m, fill); !st.ok()) return st;
  }
  if (bus->closing()) return shut_down();
  // A namespace with a publish quota: the credit admits the message here,
  // and every refusal below gives it back (the tally counts it at the end).
  // Not the shared path: a topic published to there is shared for good.
  const bool limited = nsp->pub_limited.load(std::memory_order_relaxed);
  if (limited) {
    if (Status q = nsp->admit_credit(need, may_block && options.backpressure == Backpressure::Block,
                                     options.block_timeout);
        !q.ok())
      return q;
  }
  const auto refuse = [&](Status st) {
    if (limited) nsp->give_back_credit(need);
    return st;
  };
  const std::uint32_t lane = lane_index(m.key, options.lanes);
  Slot* s = pool.take(link.mag);  // plain loads and stores unless the magazine refills
  if (s == nullptr) s = acquire_slot(lane, may_block);
  if (s == nullptr) return refuse(no_slot(may_block));
  // The slot counts in in_use now; then read closing (shutdown's Dekker:
  // shutdown sets closing, runs the heavy fence, then counts slots).
  const bool asym_ok = p.asym;
  if (asym_ok) {
    AsymmetricFence::light();
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  if (bus->closing()) [[unlikely]] {
    pool.free(s);
    return refuse(shut_down());
  }
  fill_slot(s, m, lane, id, now_ns(), schema_version, fill == nullptr && !large);
  if (fill != nullptr || large) {
    if (Status st = place_large(*this, s, m, fill, lane, may_block); !st.ok()) {
      pool.free(s);
      return refuse(st);
    }
  }

  // Solo ownership ("Solo publishers", bus_impl.hpp); without membarrier, shared.
  const bool solo = asym_ok ? open_window(*this, p.slot) : (make_shared(), false);
  route(s, lane, solo);
  if (solo) close_window(*this, p.slot);
  nsp->count_in_slot(p.slot, 1, need);
  return Status();
}

// ---------------------------------------------------------------- publish_batch (doc/performance.md)
//
// publish for many messages at once, in chunks of up to kBatchChunk: one CAS
// per freed chain claims the chunk's slots, one clock read stamps them, and
// each lane's share goes into each group's ring with one fetch_add on the
// ring's tail (and one schedule per lane). Equivalent to publish in a loop
// that stops at the first error (Topic::publish_batch documents the
// partial-batch result).

namespace {
constexpr std::uint32_t kBatchChunk = 64;
// Lane counts up to this sort a chunk's messages by lane with a table on the
// stack (publish_batch_unchecked); the table's entries are run numbers < 64.
constexpr std::uint32_t kSortLanes = 256;
static_assert(kBatchChunk < 256, "run numbers fit a byte");

// One pass over a batch (publish_batch): whether a message needs the one-by-one
// path (beyond the slot, or a due time or an expiry: publish takes it to
// delayed.cpp), the first the fast path refuses (an empty payload, a key
// beyond kMaxKeyBytes), and the bytes of them all (the namespace's usage).
struct BatchScan {
  bool slow = false;
  std::size_t bad;  // the first refused message's index, else the span's size
  std::uint64_t bytes = 0;
};
BatchScan scan_batch(std::span<const OutgoingMessage> ms, std::uint32_t slot_bytes,
                     std::int64_t default_ttl_ns) noexcept {
  BatchScan sc;
  sc.bad = ms.size();
  // has_times: the messages' fields or-ed, the call's once.
  std::int64_t times = 0;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const OutgoingMessage& m = ms[i];
    const std::size_t need = m.key.size() + m.idempotency_key.size() + m.payload.size();
    sc.bytes += need;
    sc.slow |= need > slot_bytes;
    times |= message_time_bits(m);
    if ((m.payload.empty() || (m.key.size() | m.idempotency_key.size()) > Slot::kMaxKeyBytes) && sc.bad == ms.size())
      [[unlikely]]
      sc.bad = i;
  }
  if (!ms.empty()) sc.slow |= (times | call_time_bits(default_ttl_ns)) != 0;
  return sc;
}
}  // namespace

BatchPublishResult TopicImpl::publish_batch(std::span<const OutgoingMessage> ms, bool may_block,
                                            std::uint64_t first_id, PublisherState* p) noexcept {
  if (objects_only.load(std::memory_order_relaxed)) return {0, bytes_to_typed()};
  NamespaceState* const nsp = ns.load(std::memory_order_acquire);
  const BatchScan sc = scan_batch(ms, options.slot_bytes, default_ttl_ns);
  if (schema.load(std::memory_order_acquire) != nullptr || nsp->pub_limited.load(std::memory_order_relaxed) ||
      sc.slow) {
    // A topic with a schema checks each record, a namespace with a publish
    // quota admits each message, a payload beyond the slot takes a block:
    // publish them one by one (same result as the fast path: the published
    // prefix and the first refusal).
    BatchPublishResult r;
    for (const OutgoingMessage& m : ms) {
      if (m.payload.empty()) {
        r.status = Status::from_literal(Code::InvalidArgument,
                                        "publish_batch: a message has an empty payload (nothing published)");
        return r;
      }
      if (m.key.size() + m.idempotency_key.size() + m.payload.size() > options.slot_bytes) {
        if (Status st = check_large(*this, m, nullptr); !st.ok()) {
          r.status = st;
          return r;
        }
      }
    }
    for (const OutgoingMessage& m : ms) {
      // Through the thread's publisher where there is one: the shared path
      // would make the topic shared for good.
      Status st = p != nullptr ? publish_via(*p, m, may_block) : publish(m, may_block, first_id + r.published);
      if (!st.ok()) {
        r.status = st;
        return r;
      }
      ++r.published;
    }
    return r;
  }
  BatchPublishResult r = publish_batch_unchecked(ms, may_block, first_id, p, sc.bad);
  // Usage of the namespace (no quota: admit_publish would only count).
  if (r.published > 0) {
    std::uint64_t bytes = sc.bytes;  // all of them, the common case; else the published prefix
    if (r.published < ms.size()) {
      bytes = 0;
      for (std::size_t i = 0; i < r.published; ++i)
        bytes += ms[i].key.size() + ms[i].idempotency_key.size() + ms[i].payload.size();
    }
    nsp->live.msgs_in.fetch_add(r.published, std::memory_order_relaxed);
    nsp->live.bytes_in.fetch_add(bytes, std::memory_order_relaxed);
  }
  return r;
}

namespace {
// Lane counts up to this group a chunk by buckets, one per lane, on the
// stack (sort_into_runs); the 4 KiB of them hold a whole chunk in any lane.
constexpr std::uint32_t kBucketLanes = 16;

/// A chunk's messages grouped by lane, each lane's in span order: run r is
/// the len[r] slot indices at values[r], of lane lane[r] (in `bucket` or
/// `index`).
struct LaneRuns {
  std::uint32_t bucket[kBucketLanes][kBatchChunk];
  std::uint32_t index[kBatchChunk];
  const std::uint32_t* values[kBatchChunk];
  std::uint32_t lane[kBatchChunk], len[kBatchChunk];
  std::uint32_t count = 0;
};

/// Group the `k` filled slots (lane of slot i: lanes_of[i]) into runs: one
/// pass into a bucket per lane where the topic has at most kBucketLanes (the
/// default 8), a counting sort with a table on the stack up to kSortLanes,
/// else a scan per lane.
void sort_into_runs(const MessagePool& pool, Slot* const* slots, const std::uint32_t* lanes_of, std::uint32_t k,
                    std::uint32_t lanes, LaneRuns* out) noexcept {
  std::uint32_t nruns = 0;
  if (lanes <= kBucketLanes) {
    std::uint32_t fill[kBucketLanes] = {};
    for (std::uint32_t i = 0; i < k; ++i) out->bucket[lanes_of[i]][fill[lanes_of[i]]++] = pool.index_of(slots[i]);
    for (std::uint32_t l = 0; l < lanes; ++l) {
      if (fill[l] == 0) continue;
      out->lane[nruns] = l;
      out->len[nruns] = fill[l];
      out->values[nruns++] = out->bucket[l];
    }
  } else if (lanes <= kSortLanes) {
    std::uint8_t run_of_lane[kSortLanes];  // 0: no run yet; else the run's number + 1
    std::memset(run_of_lane, 0, lanes);
    std::uint8_t run_of[kBatchChunk];
    for (std::uint32_t i = 0; i < k; ++i) {
      std::uint8_t& r1 = run_of_lane[lanes_of[i]];
      if (r1 == 0) {
        out->lane[nruns] = lanes_of[i];
        out->len[nruns] = 0;
        r1 = static_cast<std::uint8_t>(++nruns);
      }
      run_of[i] = static_cast<std::uint8_t>(r1 - 1);
      ++out->len[r1 - 1];
    }
    std::uint32_t fill[kBatchChunk];
    for (std::uint32_t r2 = 0, at = 0; r2 < nruns; at += out->len[r2++]) {
      fill[r2] = at;
      out->values[r2] = out->index + at;
    }
    for (std::uint32_t i = 0; i < k; ++i) out->index[fill[run_of[i]]++] = pool.index_of(slots[i]);
  } else {
    static_assert(kBatchChunk <= 64, "done_mask is one word");
    std::uint64_t done_mask = 0;
    std::uint32_t at = 0;
    for (std::uint32_t i = 0; i < k; ++i) {
      if (done_mask & (std::uint64_t{1} << i)) continue;
      const std::uint32_t start = at;
      out->lane[nruns] = lanes_of[i];
      out->values[nruns] = out->index + start;
      for (std::uint32_t j = i; j < k; ++j) {
        if (lanes_of[j] != lanes_of[i]) continue;
        done_mask |= std::uint64_t{1} << j;
        out->index[at++] = pool.index_of(slots[j]);
      }
      out->len[nruns] = at - start;
      ++nruns;
    }
  }
  out->count = nruns;
}

/// The topic's active groups, as route collects them: at most `max` in
/// `targets`; *overflow when there are more.
std::uint32_t active_groups(const TopicImpl& t, GroupImpl** targets, std::uint32_t max, bool* overflow) noexcept {
  std::uint32_t n = 0;
  *overflow = false;
  const std::uint32_t ng = t.group_count.load(std::memory_order_acquire);
  for (std::uint32_t gi = 0; gi < ng; ++gi) {
    GroupImpl* g = t.groups[gi].load(std::memory_order_acquire);
    if (g == nullptr || !g->active.load(std::memory_order_acquire)) continue;
    if (n == max) {
      *overflow = true;
      break;
    }
    targets[n++] = g;
  }
  return n;
}

/// Fill the chunk's `k` slots from `chunk` (ids from `first_id`, one clock
/// read), each referenced by `refs` groups; lanes_of[i]: message i's lane.
void fill_chunk(TopicImpl& t, Slot* const* slots, const OutgoingMessage* chunk, std::uint32_t k,
                std::uint64_t first_id, std::uint32_t refs, std::uint32_t* lanes_of) noexcept {
  const std::int64_t created_at = now_ns();  // one read per chunk
  // The slots' lines, for writing, kFillAhead slots ahead of the fill: a
  // worker read them last (MessagePool::take's comment).
  constexpr std::uint32_t kFillAhead = 4;
  for (std::uint32_t i = 0; i < k && i < kFillAhead; ++i) MessagePool::prefetch_slot(slots[i]);
  // The lanes first, in a loop of their own: each key's FNV-1a is a chain of
  // dependent multiplies (four cycles a byte), and here the chains of
  // several keys run side by side instead of each waiting on its slot's fill.
  for (std::uint32_t i = 0; i < k; ++i) lanes_of[i] = t.lane_of(chunk[i].key);
  for (std::uint32_t i = 0; i < k; ++i) {
    if (i + kFillAhead < k) MessagePool::prefetch_slot(slots[i + kFillAhead]);
    fill_slot(slots[i], chunk[i], lanes_of[i], first_id + i, created_at, chunk[i].schema_version);
    // relaxed: the ring append's release stores (and fence) publish it with the slot.
    slots[i]->refs.store(refs, std::memory_order_relaxed);
  }
}

/// A chunk no group takes: counted as published and unrouted, its slots freed.
void drop_unrouted(TopicImpl& t, Slot* const* slots, const std::uint32_t* lanes_of, std::uint32_t k,
                   bool solo) noexcept {
  for (std::uint32_t i = 0; i < k; ++i) {
    std::atomic<std::uint64_t>& published = t.lane_load[lanes_of[i]].published;
    if (solo) {
      published.store(published.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    } else {
      published.fetch_add(1, std::memory_order_relaxed);
    }
    t.pool.free(slots[i]);
  }
  t.unrouted.fetch_add(k, std::memory_order_relaxed);
}
}  // namespace

BatchPublishResult TopicImpl::publish_batch_unchecked(std::span<const OutgoingMessage> ms, bool may_block,
                                                      std::uint64_t first_id, PublisherState* p,
                                                      std::size_t bad) noexcept {
  // A Publisher with a slot may own the topic (solo appends per chunk, as
  // publish_via); anyone else makes it shared.
  const bool may_solo = p != nullptr && p->slot != kNoPublisherSlot && AsymmetricFence::available();
  if (!may_solo) share();
  BatchPublishResult r;
  // The first message publish_batch's scan found refused: nothing is published.
  if (bad < ms.size()) [[unlikely]] {
    r.status = ms[bad].payload.empty()
                   ? Status::from_literal(Code::InvalidArgument,
                                          "publish_batch: a message has an empty payload (nothing published)")
                   : key_too_long();
    return r;
  }
  constexpr std::uint32_t kInline = 16;
  Slot* slots[kBatchChunk];
  std::uint32_t lanes_of[kBatchChunk];
  LaneRuns runs;
  while (r.published < ms.size()) {
    if (bus->closing()) {
      r.status = shut_down();
      return r;
    }
    const OutgoingMessage* chunk = ms.data() + r.published;
    const std::uint32_t want = static_cast<std::uint32_t>(std::min<std::size_t>(kBatchChunk, ms.size() - r.published));
    // A whole chunk where the pool has it: its fixed costs (the clock, the
    // targets, the window, one append and one schedule per lane) are paid
    // once per kBatchChunk messages, not once per freed chain.
    std::uint32_t k = pool.try_alloc_up_to(slots, want);
    if (k == 0) {
      // Nothing free: this message waits (or fails, or drops) exactly as publish's.
      slots[0] = acquire_slot(lane_index(chunk[0].key, options.lanes), may_block);
      if (slots[0] == nullptr) {
        r.status = no_slot(may_block);
        return r;
      }
      k = 1;
    }
    // The pool's in_use grew (seq_cst) before this check: shutdown's Dekker, as in publish.
    if (bus->closing()) {
      for (std::uint32_t i = 0; i < k; ++i) pool.free(slots[i]);
      r.status = shut_down();
      return r;
    }
    // Targets, as in publish. More groups than kInline: the guard-reference
    // path of publish, one message at a time.
    GroupImpl* targets[kInline];
    bool overflow = false;
    const std::uint32_t n = active_groups(*this, targets, kInline, &overflow);
    if (overflow) {
      for (std::uint32_t i = 0; i < k; ++i) pool.free(slots[i]);
      Status st = publish(chunk[0], may_block, first_id + r.published);
      if (!st.ok()) {
        r.status = st;
        return r;
      }
      // publish counted the namespace's usage; publish_batch counts the whole prefix.
      ns.load(std::memory_order_acquire)
          ->unadmit_publish(chunk[0].key.size() + chunk[0].idempotency_key.size() + chunk[0].payload.size());
      ++r.published;
      continue;
    }
    fill_chunk(*this, slots, chunk, k, first_id + r.published, n, lanes_of);
    // Solo ownership for this chunk's appends ("Solo publishers", bus_impl.hpp).
    const bool solo = may_solo && open_window(*this, p->slot);
    if (n == 0) {
      drop_unrouted(*this, slots, lanes_of, k, solo);
      if (solo) close_window(*this, p->slot);
      r.published += k;
      continue;
    }
    // Each lane's messages, in span order, as one run per group ring.
    sort_into_runs(pool, slots, lanes_of, k, options.lanes, &runs);
    for (std::uint32_t r2 = 0; r2 < runs.count; ++r2) {
      const std::uint32_t lane = runs.lane[r2];
      const std::uint32_t len = runs.len[r2];
      const std::uint32_t* values = runs.values[r2];
      std::atomic<std::uint64_t>& published = lane_load[lane].published;
      if (solo) {
        published.store(published.load(std::memory_order_relaxed) + len, std::memory_order_relaxed);
      } else {
        published.fetch_add(len, std::memory_order_relaxed);
      }
      for (std::uint32_t t = 0; t < n; ++t) {
        GroupLane* gl = targets[t]->lanes[lane].get();
        if (solo) {
          gl->ring.enqueue_bulk_solo(values, len);
          AsymmetricFence::light();  // the entries, then the flag (as publish_via)
        } else {
          gl->ring.enqueue_bulk(values, len);
        }
        schedule(gl);
      }
    }
    if (solo) close_window(*this, p->slot);
    r.published += k;
  }
  return r;
}

PublisherLink* PublisherState::find_link(TopicImpl* t) noexcept {
  for (std::uint32_t i = 0; i < link_count; ++i)
    if (links[i].topic == t) return last_link = &links[i];
  if (link_count == kLinks) return nullptr;
  PublisherLink& l = links[link_count++];
  l.topic = t;
  t->pool.attach(&l.mag);
  return last_link = &l;
}

PublisherState::~PublisherState() {
  for (std::uint32_t i = 0; i < link_count; ++i) {
    TopicImpl* t = links[i].topic;
    t->pool.detach(&links[i].mag);
    if (slot != kNoPublisherSlot) {
      // Give up solo ownership: the next publisher of the topic may take it
      // (once the timer gives it back, if it has it lent: lend_to_timer).
      const std::uintptr_t mine = std::uintptr_t{slot} + 2;
      for (;;) {
        std::uintptr_t o = mine;
        if (t->owner.compare_exchange_strong(o, 0, std::memory_order_acq_rel, std::memory_order_relaxed)) break;
        if (o != (mine | TopicImpl::kLent)) break;  // shared, or never ours
        std::this_thread::yield();
      }
    }
  }
  if (slot != kNoPublisherSlot && bus != nullptr) bus->release_publisher_slot(slot);
}

}  // namespace lanebus::detail
