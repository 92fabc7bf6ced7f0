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
//  3. Ordered claims never pass an in-flight head, so the writer's claims and
//     the consumer's own can never overlap or reorder a lane.
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
    armed_ = false;
    move_ready(out);
  }
  /// Disarmed (it stays open), and the claims not taken moved to *out
  /// (appended) for the caller to give back: the consumer stopped claiming
  /// ahead for a while (its group paused).
  void disarm(std::vector<ClaimedMessage>* out) {
    std::lock_guard l(mu_);
    armed_ = false;
    move_ready(out);
  }
  /// The next commit that appends to the lane claims up to `max` messages
  /// for this mailbox (ordered claims, `visibility`). No-op when closed.
  void arm(std::uint32_t max, std::chrono::milliseconds visibility) {
    std::lock_guard l(mu_);
    (void)arm_locked(max, visibility);
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
  bool request(std::uint32_t max, std::chrono::milliseconds visibility) {
    std::lock_guard l(mu_);
    if (!arm_locked(max, visibility)) return false;
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

  /// Armed: the claim to make (*max, *options). Stays armed until offer().
  bool wanted(std::uint32_t* max, ClaimOptions* options) {
    std::lock_guard l(mu_);
    if (!armed_) return false;
    *max = max_;
    options->visibility = visibility_;
    options->ordered = true;
    return true;
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
  bool offer(std::vector<ClaimedMessage>* claims) {
    std::lock_guard l(mu_);
    if (!open_) return false;
    armed_ = false;
    if (ready_.empty()) {
      ready_.swap(*claims);
    } else {
      for (ClaimedMessage& cm : *claims) ready_.push_back(std::move(cm));
    }
    claims->clear();
    return true;
  }

 private:
  // false when closed (or max 0): nothing armed.
  bool arm_locked(std::uint32_t max, std::chrono::milliseconds visibility) {
    if (!open_ || max == 0) return false;
    armed_ = true;
    max_ = max;
    visibility_ = visibility;
    return true;
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
  std::uint64_t errors_ = 0;
  std::uint32_t max_ = 0;
  std::chrono::milliseconds visibility_{0};
  std::vector<ClaimedMessage> ready_;
};

}  // namespace lanebus::detail
