// lanebus — MIT License.
// The StoreTxn-level fence of user state behind FencedResource (fence.hpp):
// for lib/ and tests, which work on a DurableStore directly. Users reach the
// same check through Transaction::fence and FencedResource::write. Internal.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "lanebus/fence.hpp"
#include "lanebus/status.hpp"

namespace lanebus::detail {

class StoreTxn;
class DurableStore;

/// Check `token` against `resource`'s HWM inside a write transaction and
/// advance the HWM on a confirmed barrier (confirming inline, inside the
/// transaction). Call it first in a write function, before other writes: it
/// writes nothing unless it returns OK, so returning its error straight away
/// keeps StoreTxn's rule (logic errors before the first write).
/// Errors: those of Transaction::fence, plus InvalidArgument for a read
/// transaction ("write transaction").
Status fence_check(const FencedResource& fence, StoreTxn& txn, std::string_view resource, std::string_view lease,
                   std::uint64_t token);

/// fence_check and then `fn`, in one write transaction of `store`, committed
/// before this returns. A barrier is confirmed before the transaction. `fn`
/// runs only if the check passed; the HWM moves only if `fn` returns OK too.
/// `fn` follows StoreTxn's rules (it runs on the writer thread and may run more
/// than once). Errors: those of fence_check, then fn's, ShutDown, storage codes.
Status fence_write(const FencedResource& fence, DurableStore& store, std::string_view resource,
                   std::string_view lease, std::uint64_t token, const std::function<Status(StoreTxn&)>& fn);

/// The resource's HWM (0 when never written). One read transaction.
/// Errors: InvalidName, Corruption, ShutDown, storage codes.
Result<std::uint64_t> resource_high_water(DurableStore& store, std::string_view resource);

}  // namespace lanebus::detail
