// lanebus — MIT License.
// The built-in codec for plain structs described by a RecordSchema<T>: a T
// travels as a record of record.hpp (doc/schemas.md's encoding), so a durable
// typed topic can also carry a registered schema and be read by any process.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "lanebus/codec.hpp"
#include "lanebus/record.hpp"

namespace lanebus {

/// One field of a RecordSchema: the record field id and the member it holds.
template <typename T, typename M>
struct RecordField {
  std::uint32_t id;
  M T::*member;
};

/// record_field(1, &Order::customer): the member types a field may have are
/// bool, signed integers (int64), unsigned integers (uint64), float and
/// double (double), and std::string (string).
template <typename T, typename M>
constexpr RecordField<T, M> record_field(std::uint32_t id, M T::*member) noexcept {
  return {id, member};
}

/// Describe a struct as a record: specialize with
///
///   template <> struct lanebus::RecordSchema<Order> {
///     static constexpr auto fields = std::make_tuple(lanebus::record_field(1, &Order::customer),
///                                                    lanebus::record_field(2, &Order::cents));
///   };
///
/// and Codec<Order> exists: encode writes every field (ids 1..65535, each
/// once); decode reads each field by id, keeps the member's value for a
/// field the record lacks (an older writer), and fails on a field of another
/// type (Corruption naming the id).
template <typename T>
struct RecordSchema;

namespace detail {

// The builder's errors are sticky: finish() reports the first one.
template <typename M>
void put_record_field(RecordBuilder& b, std::uint32_t id, const M& v) noexcept {
  if constexpr (std::same_as<M, bool>) {
    b.add_bool(id, v);
  } else if constexpr (std::signed_integral<M>) {
    b.add_int64(id, static_cast<std::int64_t>(v));
  } else if constexpr (std::unsigned_integral<M>) {
    b.add_uint64(id, static_cast<std::uint64_t>(v));
  } else if constexpr (std::floating_point<M>) {
    b.add_double(id, static_cast<double>(v));
  } else {
    static_assert(std::same_as<M, std::string>, "RecordSchema fields: bool, integers, floating point, std::string");
    b.add_string(id, v);
  }
}

template <typename M, typename R>
Status take_record_field(const Result<R>& r, std::uint32_t id, M& out) {
  if (!r.ok()) {
    if (r.code() == Code::NotFound) return Status();  // absent: keep the member's value
    return Status(Code::Corruption, "record field " + std::to_string(id) + ": " + std::string(r.status().message()));
  }
  if constexpr (std::same_as<M, std::string>) {
    out.assign(r.value());
  } else {
    out = static_cast<M>(r.value());
  }
  return Status();
}

template <typename M>
Status get_record_field(const RecordView& v, std::uint32_t id, M& out) {
  if (!v.has(id)) return Status();
  if constexpr (std::same_as<M, bool>) {
    return take_record_field(v.get_bool(id), id, out);
  } else if constexpr (std::signed_integral<M>) {
    return take_record_field(v.get_int64(id), id, out);
  } else if constexpr (std::unsigned_integral<M>) {
    return take_record_field(v.get_uint64(id), id, out);
  } else if constexpr (std::floating_point<M>) {
    return take_record_field(v.get_double(id), id, out);
  } else {
    return take_record_field(v.get_string(id), id, out);
  }
}

}  // namespace detail

/// Codec for structs with a RecordSchema.
template <typename T>
  requires requires { RecordSchema<T>::fields; }
struct Codec<T> {
  static constexpr std::string_view name = "lanebus::Codec<RecordSchema>";

  static Status encode(const T& value, std::string& out) {
    // A first guess of the size; grown and retried when the builder runs out.
    std::size_t guess = 64;
    std::apply([&](const auto&... f) { ((guess += 16 + field_size(value.*(f.member))), ...); },
               RecordSchema<T>::fields);
    for (;;) {
      out.resize(guess);
      RecordBuilder b(out.data(), out.size());
      std::apply([&](const auto&... f) { (detail::put_record_field(b, f.id, value.*(f.member)), ...); },
                 RecordSchema<T>::fields);
      Result<std::string_view> r = b.finish();
      if (r.ok()) {
        out.resize(r.value().size());
        return Status();
      }
      if (r.code() != Code::PayloadTooLarge) return r.status();
      guess *= 2;
    }
  }

  static Status decode(std::string_view bytes, T& out) {
    auto view = RecordView::parse(bytes);
    if (!view.ok()) return view.status();
    Status st;
    std::apply(
        [&](const auto&... f) {
          ((st.ok() ? (void)(st = detail::get_record_field(view.value(), f.id, out.*(f.member))) : (void)0), ...);
        },
        RecordSchema<T>::fields);
    return st;
  }

 private:
  template <typename M>
  static std::size_t field_size(const M& v) noexcept {
    if constexpr (std::same_as<M, std::string>) {
      return v.size();
    } else {
      return sizeof(M);
    }
  }
};

}  // namespace lanebus
