// lanebus — MIT License.
// Replaces the global operator new family and interposes malloc/calloc/realloc/
// aligned allocators (forwarding to glibc's __libc_* entry points) to count them.
#include "alloc_counter.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LANEBUS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LANEBUS_SANITIZED 1
#endif
#endif

namespace {
std::atomic<bool> g_on{false};
std::atomic<std::uint64_t> g_count{0};
inline void note() noexcept {
  if (g_on.load(std::memory_order_relaxed)) g_count.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

namespace lanebus::test {
void alloc_counting(bool on) { g_on.store(on, std::memory_order_seq_cst); }
std::uint64_t alloc_count() { return g_count.load(std::memory_order_seq_cst); }
void alloc_count_reset() { g_count.store(0, std::memory_order_seq_cst); }
bool sanitized() noexcept {
#ifdef LANEBUS_SANITIZED
  return true;
#else
  return false;
#endif
}

void skip_if_sanitized() {
#ifdef LANEBUS_SANITIZED
  std::printf("SKIP: allocation counting needs the real malloc; sanitizers replace it\n");
  std::fflush(stdout);
  std::_Exit(77);
#endif
}
}  // namespace lanebus::test

#ifndef LANEBUS_SANITIZED
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void __libc_free(void*);

void* malloc(std::size_t n) {
  note();
  return __libc_malloc(n);
}
void* calloc(std::size_t a, std::size_t b) {
  note();
  return __libc_calloc(a, b);
}
void* realloc(void* p, std::size_t n) {
  note();
  return __libc_realloc(p, n);
}
void free(void* p) { __libc_free(p); }
void* aligned_alloc(std::size_t al, std::size_t n) {
  note();
  return __libc_memalign(al, n);
}
void* memalign(std::size_t al, std::size_t n) {
  note();
  return __libc_memalign(al, n);
}
int posix_memalign(void** out, std::size_t al, std::size_t n) {
  note();
  void* p = __libc_memalign(al, n);
  if (p == nullptr) return 12;  // ENOMEM
  *out = p;
  return 0;
}
}

void* operator new(std::size_t n) {
  void* p = malloc(n ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return malloc(n ? n : 1); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return malloc(n ? n : 1); }
void* operator new(std::size_t n, std::align_val_t al) {
  void* p = aligned_alloc(static_cast<std::size_t>(al), (n + static_cast<std::size_t>(al) - 1) & ~(static_cast<std::size_t>(al) - 1));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](std::size_t n, std::align_val_t al) { return operator new(n, al); }
void operator delete(void* p) noexcept { free(p); }
void operator delete[](void* p) noexcept { free(p); }
void operator delete(void* p, std::size_t) noexcept { free(p); }
void operator delete[](void* p, std::size_t) noexcept { free(p); }
void operator delete(void* p, std::align_val_t) noexcept { free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { free(p); }
#endif
