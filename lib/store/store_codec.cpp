// lanebus — MIT License.
// The durable store's record codecs (doc/storage-format.md): lane bounds,
// topics, log records, the layout record, and the decoders store_codec.hpp
// exposes to the verify walk and the fuzz targets.
#include "store_codec.hpp"

#include <cstring>

#include "coding.hpp"
#include "crc32c.hpp"
#include "durable_store_impl.hpp"
#include "header_block.hpp"
#include "quote.hpp"

namespace lanebus::detail {

// ---- per-lane bounds ----
void encode_lane(const LaneState& s, char* p) {
  put_le64(p, s.first);
  put_le64(p + 8, s.next);
  put_le64(p + 16, s.bytes);
  put_le64(p + 24, s.count);
  put_le64(p + 32, static_cast<std::uint64_t>(s.last_ts));
}
bool decode_lane(std::string_view v, LaneState* s) {
  if (v.size() != kLaneStateBytes) return false;
  s->first = get_le64(v.data());
  s->next = get_le64(v.data() + 8);
  s->bytes = get_le64(v.data() + 16);
  s->count = get_le64(v.data() + 24);
  s->last_ts = static_cast<std::int64_t>(get_le64(v.data() + 32));
  return s->first <= s->next && s->count == s->next - s->first;
}

// ---- topic record ----
constexpr std::size_t kTopicBytes = 48;
// Version 2 (fenced topics only) appends: u8 per-lane, u8 0, le16 length, the
// fence name. Unfenced topics stay version 1; an older lanebus refuses a
// version-2 record instead of appending unfenced to a fenced topic.
std::string encode_topic(const TopicRef& t, std::int64_t created_ns) {
  std::string v(kTopicBytes, '\0');
  put_le32(v.data(), t.fence.empty() ? 1 : 2);
  put_le32(v.data() + 4, t.id);
  put_le32(v.data() + 8, t.lanes);
  v[12] = t.is_queue ? 1 : 0;
  put_le64(v.data() + 16, static_cast<std::uint64_t>(t.retention.max_age.count()));
  put_le64(v.data() + 24, t.retention.max_bytes);
  put_le64(v.data() + 32, t.retention.max_count);
  put_le64(v.data() + 40, static_cast<std::uint64_t>(created_ns));
  if (!t.fence.empty()) {
    char f[4] = {static_cast<char>(t.fence_per_lane ? 1 : 0), 0, 0, 0};
    put_le16(f + 2, static_cast<std::uint16_t>(t.fence.size()));
    v.append(f, 4);
    v.append(t.fence);
  }
  return v;
}
bool decode_topic(std::string_view name, std::string_view v, TopicRef* t) {
  const std::uint32_t format = v.size() >= kTopicBytes ? get_le32(v.data()) : 0;
  if (format != 1 && format != 2) return false;
  t->name = std::string(name);
  t->id = get_le32(v.data() + 4);
  t->lanes = get_le32(v.data() + 8);
  t->is_queue = v[12] != 0;
  t->retention.max_age = std::chrono::milliseconds(static_cast<std::int64_t>(get_le64(v.data() + 16)));
  t->retention.max_bytes = get_le64(v.data() + 24);
  t->retention.max_count = get_le64(v.data() + 32);
  t->fence.clear();
  t->fence_per_lane = false;
  if (format == 2) {
    if (v.size() < kTopicBytes + 4 || v.size() != kTopicBytes + 4 + get_le16(v.data() + kTopicBytes + 2)) return false;
    t->fence_per_lane = v[kTopicBytes] != 0;
    t->fence.assign(v.data() + kTopicBytes + 4, v.size() - kTopicBytes - 4);
    if (t->fence.empty()) return false;
  }
  return t->id != 0 && t->lanes >= 1 && t->lanes <= kMaxLanes;
}

// ---- log record (see doc/storage-format.md) ----
// Format 2 (a due time or an expiry, doc/delays.md) appends an extension
// block after the payload, its length in header bytes 6..7: le16 length (24),
// le16 flags (1 due, 2 expiry), 4 zero bytes, le64 due ns, le64 expiry ns.
// Format 3 (message headers, doc/tracing.md) is format 2 with flag 4 and the
// stored header block (HeadersView) right after those 24 bytes; the length
// covers both. Format 1 records are unchanged; an older lanebus refuses
// format 2 and 3 ("unknown record format") instead of losing the extension.
constexpr std::size_t kRecordExtension = 24;
constexpr std::uint16_t kRecordHeadersFlag = 4;
std::size_t record_extension(const AppendRequest& r) {
  if ((r.due_ns | r.expires_ns) == 0 && r.headers.empty()) return 0;
  return kRecordExtension + r.headers.size();
}
std::size_t record_size(const AppendRequest& r) {
  return kRecordOverhead + r.key.size() + r.idempotency_key.size() + r.payload.size() + record_extension(r);
}
void encode_record(char* p, std::size_t size, const AppendRequest& r, const MessageHeader& h,
                   std::int64_t index_ts) {
  std::memset(p, 0, kRecordHeader);
  p[0] = 1;  // record format
  put_le16(p + 2, static_cast<std::uint16_t>(r.key.size()));
  put_le16(p + 4, static_cast<std::uint16_t>(r.idempotency_key.size()));
  put_le32(p + 8, static_cast<std::uint32_t>(r.payload.size()));
  put_le64(p + 16, static_cast<std::uint64_t>(index_ts));
  put_le64(p + 24, h.id);
  put_le64(p + 32, static_cast<std::uint64_t>(h.created_at_ns));
  put_le64(p + 40, h.correlation_id);
  put_le64(p + 48, h.fencing_token);
  put_le32(p + 56, h.attempt);
  put_le16(p + 60, h.content_type);
  put_le16(p + 62, h.schema_version);
  char* d = p + kRecordHeader;
  std::memcpy(d, r.key.data(), r.key.size());
  d += r.key.size();
  std::memcpy(d, r.idempotency_key.data(), r.idempotency_key.size());
  d += r.idempotency_key.size();
  std::memcpy(d, r.payload.data(), r.payload.size());
  if (const std::size_t elen = record_extension(r); elen != 0) [[unlikely]] {
    p[0] = r.headers.empty() ? 2 : 3;
    put_le16(p + 6, static_cast<std::uint16_t>(elen));
    d += r.payload.size();
    put_le16(d, static_cast<std::uint16_t>(elen));
    put_le16(d + 2, static_cast<std::uint16_t>((r.due_ns != 0 ? 1 : 0) | (r.expires_ns != 0 ? 2 : 0) |
                                               (r.headers.empty() ? 0 : kRecordHeadersFlag)));
    put_le32(d + 4, 0);
    put_le64(d + 8, static_cast<std::uint64_t>(r.due_ns));
    put_le64(d + 16, static_cast<std::uint64_t>(r.expires_ns));
    if (!r.headers.empty()) std::memcpy(d + kRecordExtension, r.headers.data(), r.headers.size());
  }
  put_le32(p + size - 4, crc32c(p, size - 4));
}

Status decode_record_in_place(std::string_view v, std::string_view topic, std::uint32_t lane, std::uint64_t off,
                              MessageRef* m) {
  auto bad = [&](const char* why) {
    return Status(Code::Corruption, "read topic " + quoted(topic) + " lane " + std::to_string(lane) + " offset " +
                                        std::to_string(off) + ": " + why);
  };
  if (v.size() < kRecordOverhead) return bad("record shorter than its header");
  const char* p = v.data();
  if (p[0] != 1 && p[0] != 2 && p[0] != 3) return bad("unknown record format");
  std::size_t klen = get_le16(p + 2), ilen = get_le16(p + 4), plen = get_le32(p + 8);
  const std::size_t elen = p[0] != 1 ? get_le16(p + 6) : 0;  // the extension block (formats 2 and 3)
  if (p[0] != 1 && elen < kRecordExtension) return bad("record extension block too short");
  if (kRecordOverhead + klen + ilen + plen + elen != v.size()) return bad("record lengths do not add up");
  if (crc32c(p, v.size() - 4) != get_le32(p + v.size() - 4)) return bad("record checksum mismatch");
  m->lane = lane;
  m->offset = off;
  m->index_ts_ns = static_cast<std::int64_t>(get_le64(p + 16));
  m->header.id = get_le64(p + 24);
  m->header.created_at_ns = static_cast<std::int64_t>(get_le64(p + 32));
  m->header.correlation_id = get_le64(p + 40);
  m->header.fencing_token = get_le64(p + 48);
  m->header.attempt = get_le32(p + 56);
  m->header.content_type = get_le16(p + 60);
  m->header.schema_version = get_le16(p + 62);
  const char* d = p + kRecordHeader;
  m->key = std::string_view(d, klen);
  m->idempotency_key = std::string_view(d + klen, ilen);
  m->payload = std::string_view(d + klen + ilen, plen);
  m->due_ns = 0;
  m->expires_ns = 0;
  m->headers = {};
  if (elen != 0) [[unlikely]] {
    const char* e = d + klen + ilen + plen;
    if (get_le16(e) != elen) return bad("record extension block length mismatch");
    m->due_ns = static_cast<std::int64_t>(get_le64(e + 8));
    m->expires_ns = static_cast<std::int64_t>(get_le64(e + 16));
    const bool has_headers = (get_le16(e + 2) & kRecordHeadersFlag) != 0;
    if (has_headers != (p[0] == 3)) return bad("record headers flag does not match its format");
    if (has_headers) {
      const std::string_view block(e + kRecordExtension, elen - kRecordExtension);
      if (block.empty() || !valid_header_block(block)) return bad("record headers are malformed");
      m->headers = block;
    }
  }
  return Status();
}

Status decode_record(std::string_view v, std::string_view topic, std::uint32_t lane, std::uint64_t off,
                     StoredMessage* m) {
  MessageRef r;
  if (Status s = decode_record_in_place(v, topic, lane, off, &r); !s.ok()) return s;
  copy_message(r, m);
  return Status();
}

void copy_message(const MessageRef& r, StoredMessage* m) {
  m->header = r.header;
  m->lane = r.lane;
  m->offset = r.offset;
  m->index_ts_ns = r.index_ts_ns;
  m->key.assign(r.key);
  m->idempotency_key.assign(r.idempotency_key);
  m->payload.assign(r.payload);
  m->due_ns = r.due_ns;
  m->expires_ns = r.expires_ns;
  m->headers.assign(r.headers);
}

// ---- exposed decoders (lib/store/store_codec.hpp: the verify walk and fuzz targets) ----

Status decode_log_record(std::string_view value, std::string_view topic, std::uint32_t lane, std::uint64_t offset,
                         StoredMessage* out) {
  return decode_record(value, topic, lane, offset, out);
}

Status split_log_value(std::string_view value, std::string_view topic, std::uint32_t lane, std::uint64_t first,
                       std::vector<std::string_view>* records) {
  records->clear();
  if (value.empty() || value[0] != kBatchFormat) {
    records->push_back(value);
    return Status();
  }
  auto bad = [&](std::uint64_t off, const char* why) {
    return Status(Code::Corruption, "read topic " + quoted(topic) + " lane " + std::to_string(lane) + " offset " +
                                        std::to_string(off) + ": " + why);
  };
  if (value.size() < kBatchHeader) return bad(first, "record batch shorter than its header");
  const std::uint32_t count = get_le16(value.data() + 2);
  if (count < 2) return bad(first, "record batch holds fewer than 2 records");
  std::size_t pos = kBatchHeader;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t size = stored_record_size(value.data() + pos, value.size() - pos);
    if (size == 0) return bad(first + i, "record batch is malformed");
    records->push_back(value.substr(pos, size));
    pos += size;
  }
  if (pos != value.size()) return bad(first + count - 1, "record batch lengths do not add up");
  return Status();
}

std::string encode_log_record(const AppendRequest& request, std::int64_t index_ts) {
  std::string v(record_size(request), '\0');
  encode_record(v.data(), v.size(), request, request.header, index_ts);
  return v;
}

bool decode_topic_record(std::string_view name, std::string_view value, TopicRef* out) {
  return decode_topic(name, value, out);
}

bool decode_lane_record(std::string_view value, LaneRecord* out) {
  LaneState s;
  if (!decode_lane(value, &s)) return false;
  *out = LaneRecord{s.first, s.next, s.bytes, s.count, s.last_ts};
  return true;
}

bool decode_group_record(std::string_view value, GroupRecord* out) {
  if (value.size() != 16) return false;
  out->format = get_le32(value.data());
  out->group_id = get_le32(value.data() + 4);
  out->created_ns = static_cast<std::int64_t>(get_le64(value.data() + 8));
  return out->format == 1 && out->group_id != 0;
}

bool decode_cursor_record(std::string_view value, CursorRecord* out) {
  if (value.size() != 16) return false;
  out->committed = get_le64(value.data());
  out->skipped = get_le64(value.data() + 8);
  return true;
}

bool decode_inflight_record(std::string_view value, InflightRecord* out) {
  if (value.size() != 24) return false;
  out->attempt = get_le32(value.data());
  out->state = get_le32(value.data() + 4);
  out->deadline_ns = static_cast<std::int64_t>(get_le64(value.data() + 8));
  out->first_claim_ns = static_cast<std::int64_t>(get_le64(value.data() + 16));
  return out->attempt >= 1 && (out->state == kInflightClaimed || out->state == kInflightAcked);
}

Status check_layout_record(std::string_view value) {
  if (value.size() != 12 || std::memcmp(value.data(), kLayoutMagic, 8) != 0) {
    return Status(Code::Corruption, "the layout record is not lanebus's (foreign data)");
  }
  const std::uint32_t version = get_le32(value.data() + 8);
  if (version > kLayoutVersion) {
    return Status(Code::VersionTooNew, "layout version " + std::to_string(version) + " was written by a newer lanebus");
  }
  if (version == 0) return Status(Code::Corruption, "layout version 0 is invalid");
  return Status();
}

std::string encode_layout_record(std::uint32_t version) {
  std::string v(kLayoutMagic, sizeof kLayoutMagic);
  v.resize(12);
  put_le32(v.data() + 8, version);
  return v;
}

}  // namespace lanebus::detail
