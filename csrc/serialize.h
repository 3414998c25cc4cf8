// Little-endian binary snapshots with a magic tag, a format version and a
// trailing FNV-1a checksum, so a truncated or corrupted file is refused instead
// of being half-read.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "snapshots are written in host order, which must be little-endian");

namespace rwcore {

inline uint64_t fnv1a64(const char* data, size_t size) {
  uint64_t hash = 0xCBF29CE484222325ULL;
  for (size_t i = 0; i < size; ++i) {
    hash ^= static_cast<unsigned char>(data[i]);
    hash *= 0x100000001B3ULL;
  }
  return hash;
}

class ByteWriter {
 public:
  ByteWriter(const char magic[8], uint32_t format_version) {
    buffer_.append(magic, 8);
    put<uint32_t>(format_version);
  }

  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    buffer_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }

  template <typename T>
  void put_vector(const std::vector<T>& values) {
    put<uint64_t>(values.size());
    if (!values.empty())
      buffer_.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  }

  void put_bytes(const std::string& bytes) {
    put<uint64_t>(bytes.size());
    buffer_.append(bytes);
  }

  // Appends the checksum and hands the finished snapshot over.
  std::string finish() {
    put<uint64_t>(fnv1a64(buffer_.data(), buffer_.size()));
    return std::move(buffer_);
  }

 private:
  std::string buffer_;
};

class ByteReader {
 public:
  // Checks magic, format version and checksum up front; `what` names the
  // snapshot in error messages.
  ByteReader(const std::string& bytes, const char magic[8], uint32_t format_version,
             std::string what)
      : bytes_(bytes), what_(std::move(what)) {
    if (bytes_.size() < 8 + sizeof(uint32_t) + sizeof(uint64_t))
      fail("is truncated (" + std::to_string(bytes_.size()) + " bytes)");
    if (std::memcmp(bytes_.data(), magic, 8) != 0)
      fail("is not a snapshot of this kind (wrong magic bytes)");
    const size_t body = bytes_.size() - sizeof(uint64_t);
    uint64_t stored;
    std::memcpy(&stored, bytes_.data() + body, sizeof(stored));
    offset_ = 8;
    const auto version = get<uint32_t>();
    if (version != format_version)
      fail("has format version " + std::to_string(version) + ", this build reads version " +
           std::to_string(format_version));
    if (stored != fnv1a64(bytes_.data(), body))
      fail("is corrupted or truncated (checksum mismatch)");
    end_ = body;
  }

  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  template <typename T>
  std::vector<T> get_vector(uint64_t max_count) {
    const auto count = get<uint64_t>();
    if (count > max_count) fail("declares an implausible array length " + std::to_string(count));
    need(count * sizeof(T));
    std::vector<T> values(count);
    if (count) std::memcpy(values.data(), bytes_.data() + offset_, count * sizeof(T));
    offset_ += count * sizeof(T);
    return values;
  }

  std::string get_bytes() {
    const auto size = get<uint64_t>();
    need(size);
    std::string out = bytes_.substr(offset_, size);
    offset_ += size;
    return out;
  }

  void expect_end() const {
    if (offset_ != end_) fail("has " + std::to_string(end_ - offset_) + " unexpected trailing bytes");
  }

  [[noreturn]] void fail(const std::string& message) const {
    throw std::invalid_argument(what_ + " " + message);
  }

 private:
  void need(uint64_t size) const {
    if (size > end_ - offset_) fail("is truncated");
  }

  const std::string& bytes_;
  std::string what_;
  size_t offset_ = 0;
  size_t end_ = SIZE_MAX;
};

}  // namespace rwcore
