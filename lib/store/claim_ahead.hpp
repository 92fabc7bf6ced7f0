// lanebus — MIT License.
// ClaimAhead: a durable queue lane's claims made in the transaction that
// appended to the lane (doc/durable.md, "Claims in the append's transaction").
//
// Without it a message of a Sync queue waits for two fsynced commits before
// its handler runs: the append's, then the consumer's claim (the attempt must
// be on disk before the call: poison detection, SPEC §3), and the claim
// queues behind whatever commit the writer began meanwhile. With it, a
// consumer whose lane ran dry arms its mailbox; the writer's next batch that
// appends to the lane claims up to `max` messages for it inside the same
// transaction (QueueClaims::claim_in, the same claim a consumer makes), and
// after the commit puts them here before the append listener schedules the
// lane. The consumer takes them instead of asking the store. A consumer
// whose mailbox is empty when its lane is scheduled does not wait for a claim
// of its own either: it requests one (request()), the writer makes it in its
// next commit beside whatever else that commit carries, and the hand-over
// schedules the lane. So no worker thread ever waits for a claim's commit.
//
// Invariants:
//  1. Only committed claims are in `ready` (the writer puts them after the
//     commit; an aborted batch's claims are dropped with the batch).
//  2. A closed mailbox is never armed and never receives claims: the writer
//     gives back (unclaims) what it claimed for a mailbox that closed before
//     the commit, and close() returns what was not taken, for the caller to
//     give back. So no claim is left waiting out its visibility by a clean
//     close or shutdown; only a dead process's claims expire, as ever.
//  3. An ordered claim passes an in-flight message only when it was handed
//     to this mailbox in its current generation, at its first attempt, with
//     the deadline the store still holds (holds()), and only for a
//     pipelined mailbox. So the writer's claims and the consumer's own never
//     overlap, and a mailbox gets its lane's claims in offset order.
//  4. disarm() and close() start a new generation and forget what was
//     handed: a claim made under an older generation (in the commit under
//     way) is refused by offer() and given back by the writer. A consumer
//     that breaks off a run (a retry) disarms, so nothing claimed behind the
//     message it retries reaches it before that message again.
//
// Pipelined mailboxes (arm(..., true)): the writer claims for one while
// claims it handed earlier are still being handled, behind them, as long as
// fewer than `max` wait in `ready`; offer() leaves it armed. Without it a
// message appended while its lane's head is in flight waited for the head's
// ack and a request: one or two commits more (doc/performance.md, "The hop
// after the commit"). A message claimed behind others waits for them, so
// its visibility runs while they are handled (as the later messages of a
// batch claim's do).
//
// Thread safety: arm/take/open/close from the consumer's side (any thread;
// the lane's owner in practice), offer from the writer thread; all under mu_.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "durable_store.hpp"

namespace lanebus::detail {

class ClaimAhead {
 public:
  ClaimAhead(const TopicRef& topic, const GroupRef& group, std::uint32_t lane)
      : topic_(topic), group_(group), lane_(lane) {}
  ClaimAhead(const ClaimAhead&) = delete;
  ClaimAhead& operator=(const ClaimAhead&) = delete;

  const TopicRef& topic() const noexcept { return topic_; }
  const GroupRef& group() const noexcept { return group_; }
  std::uint32_t lane() const noexcept { return lane_; }

  /// A consumer exists: arm() may take effect.
  void open() {
    std::lock_guard l(mu_);
    open_ = true;
  }
  /// No consumer any more: disarmed, and what the writer claimed and nobody
  /// took is moved to *out (appended) for the caller to give back.
  void close(std::vector<ClaimedMessage>* out) {
    std::lock_guard l(mu_);
    open_ = false;
    reset_locked(out);
  }
  /// Disarmed (it stays open), and the claims not taken moved to *out
  /// (appended) for the caller to give back: the consumer stopped claiming
  /// ahead for a while (its group paused), or broke off a run (a retry).
  void disarm(std::vector<ClaimedMessage>* out) {
    std::lock_guard l(mu_);
    reset_locked(out);
  }
  /// The next commit that appends to the lane claims up to `max` messages
  /// for this mailbox (ordered claims, `visibility`); `pipelined`: also
  /// behind the claims it handed that are still in flight, and it stays
  /// armed. No-op when closed.
  void arm(std::uint32_t max, std::chrono::milliseconds visibility, bool pipelined = false) {
    std::lock_guard l(mu_);
    (void)arm_locked(max, visibility, pipelined);
  }
  /// Moves the claims the writer made (appended to *out); false when none.
  bool take(std::vector<ClaimedMessage>* out) {
    std::lock_guard l(mu_);
    if (ready_.empty()) return false;
    move_ready(out);
    return true;
  }
  /// Claims are waiting to be taken.
  bool has_ready() {
    std::lock_guard l(mu_);
    return !ready_.empty();
  }
  /// Arms it and asks for a claim in the writer's next commit, appends or
  /// not (DurableStore::request_claims). False when closed or when a request
  /// is already outstanding: nothing to send.
  bool request(std::uint32_t max, std::chrono::milliseconds visibility, bool pipelined = false) {
    std::lock_guard l(mu_);
    if (!arm_locked(max, visibility, pipelined)) return false;
    if (requested_) {
      missed_ = true;  // answered() tells the writer to wake the lane
      return false;
    }
    requested_ = true;
    return true;
  }
  /// Claims that failed for a reason of their own (a damaged record), for
  /// the consumer's error count; zeroed.
  std::uint64_t take_errors() {
    std::lock_guard l(mu_);
    return std::exchange(errors_, 0);
  }

  // ---- the writer's side (QueueClaims)

  /// Armed: the claim to make (*max, *options) and the generation to pass
  /// to offer(). Stays armed until offer(). A pipelined mailbox asks for
  /// what fits beside the claims waiting in it; false when that is none.
  bool wanted(std::uint32_t* max, ClaimOptions* options, std::uint64_t* gen) {
    std::lock_guard l(mu_);
    if (!armed_) return false;
    *max = max_;
    if (pipelined_) {
      if (ready_.size() >= max_) return false;
      *max = max_ - static_cast<std::uint32_t>(ready_.size());
    }
    options->visibility = visibility_;
    options->ordered = true;
    *gen = gen_;
    return true;
  }
  /// May an ordered claim for this mailbox pass the in-flight message at
  /// `offset` whose claim ends at `deadline_ns` (invariant 3)? The writer,
  /// at its first attempt only.
  bool holds(std::uint64_t offset, std::int64_t deadline_ns) {
    std::lock_guard l(mu_);
    if (!pipelined_) return false;
    for (std::uint64_t i = handed_head_; i != handed_tail_; ++i) {
      const Handed& h = handed_[i % kHanded];
      if (h.offset == offset) return h.deadline_ns == deadline_ns;
      if (h.offset > offset) return false;
    }
    return false;
  }
  /// The writer: the claims it handed below `offset` were acked (the
  /// group's committed offset passed them); they no longer let a claim pass.
  void settled_below(std::uint64_t offset) {
    std::lock_guard l(mu_);
    while (handed_head_ != handed_tail_ && handed_[handed_head_ % kHanded].offset < offset) ++handed_head_;
  }
  /// The writer's commit (or abort) that answered request() is over. True
  /// when a request was refused meanwhile: the lane must look again.
  bool answered() {
    std::lock_guard l(mu_);
    requested_ = false;
    return std::exchange(missed_, false);
  }
  void note_error() {
    std::lock_guard l(mu_);
    ++errors_;
  }
  /// After the commit: hands `claims` over and disarms. False when the
  /// mailbox closed meanwhile: the claims stay in *claims, for the writer to
  /// give back.
  bool offer(std::vector<ClaimedMessage>* claims, std::uint64_t gen) {
    std::lock_guard l(mu_);
    if (!open_ || gen != gen_) return false;
    if (!pipelined_) armed_ = false;
    for (const ClaimedMessage& cm : *claims) {
      if (!pipelined_) break;
      // Kept in offset order: a claim at or below the last noted one (a
      // redelivery) restarts the record. A full record lets no claim pass
      // the ones it could not note: safe.
      if (handed_head_ != handed_tail_ && handed_[(handed_tail_ - 1) % kHanded].offset >= cm.message.offset)
        handed_head_ = handed_tail_;
      if (handed_tail_ - handed_head_ == kHanded) break;
      handed_[handed_tail_++ % kHanded] = Handed{cm.message.offset, cm.deadline_ns};
    }
    if (ready_.empty()) {
      ready_.swap(*claims);
    } else {
      for (ClaimedMessage& cm : *claims) ready_.push_back(std::move(cm));
    }
    claims->clear();
    return true;
  }

 private:
  struct Handed {
    std::uint64_t offset;
    std::int64_t deadline_ns;
  };
  static constexpr std::uint64_t kHanded = 256;

  // false when closed (or max 0): nothing armed.
  bool arm_locked(std::uint32_t max, std::chrono::milliseconds visibility, bool pipelined) {
    if (!open_ || max == 0) return false;
    armed_ = true;
    max_ = max;
    visibility_ = visibility;
    if (pipelined != pipelined_) handed_head_ = handed_tail_ = 0;
    pipelined_ = pipelined;
    return true;
  }
  // Disarmed, a new generation, nothing handed; the claims not taken to *out.
  void reset_locked(std::vector<ClaimedMessage>* out) {
    armed_ = false;
    ++gen_;
    handed_head_ = handed_tail_ = 0;
    move_ready(out);
  }
  void move_ready(std::vector<ClaimedMessage>* out) {
    if (out->empty()) {
      out->swap(ready_);
    } else {
      for (ClaimedMessage& cm : ready_) out->push_back(std::move(cm));
    }
    ready_.clear();
  }

  const TopicRef topic_;
  const GroupRef group_;
  const std::uint32_t lane_;
  std::mutex mu_;
  bool open_ = false;
  bool armed_ = false;
  bool requested_ = false;
  bool missed_ = false;
  bool pipelined_ = false;
  std::uint64_t gen_ = 0;
  std::uint64_t errors_ = 0;
  // Claims handed over in this generation and not yet seen acked
  // (settled_below), in offset order: [handed_head_, handed_tail_) modulo kHanded.
  Handed handed_[kHanded];
  std::uint64_t handed_head_ = 0, handed_tail_ = 0;
  std::uint32_t max_ = 0;
  std::chrono::milliseconds visibility_{0};
  std::vector<ClaimedMessage> ready_;
};

}  // namespace lanebus::detail
