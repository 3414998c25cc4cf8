#include "evidence_store.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include "serialize.h"

namespace rwcore {
namespace {

constexpr char kStoreMagic[8] = {'R', 'W', 'E', 'V', 'S', 'T', 'O', 'R'};
constexpr uint32_t kStoreFormat = 1;

std::string describe(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.17g", value);  // std::to_string prints 1e308 as 309 digits
  return buffer;
}

}  // namespace

void check_id(int64_t value, const char* name) {
  if (value < 0 || value > EvidenceStore::kMaxId)
    throw std::invalid_argument(std::string(name) + " must be in [0, 2**32), got " +
                                std::to_string(value));
}

void check_version(int64_t value, const char* name) {
  if (value < 0)
    throw std::invalid_argument(std::string(name) + " must be a non-negative policy version, got " +
                                std::to_string(value));
}

void check_evidence(double value, const char* name) {
  if (!std::isfinite(value) || value < 0.0)
    throw std::invalid_argument(std::string(name) + " must be finite and non-negative, got " +
                                describe(value));
}

void check_gamma(double value, const char* name) {
  if (!(value > 0.0 && value <= 1.0))
    throw std::invalid_argument(std::string(name) + " must be in (0, 1], got " + describe(value));
}

EvidenceStore::EvidenceStore(double gamma_obs, double gamma_unobs)
    : gamma_obs_(gamma_obs), gamma_unobs_(gamma_unobs) {
  check_gamma(gamma_obs, "gamma_obs");
  check_gamma(gamma_unobs, "gamma_unobs");
  fill_powers();
}

void EvidenceStore::fill_powers() {
  unobserved_powers_.resize(kPowerTableSize);
  observed_factors_.resize(kPowerTableSize);
  for (int64_t k = 0; k < kPowerTableSize; ++k) {
    unobserved_powers_[k] = std::pow(gamma_unobs_, static_cast<double>(k));
    observed_factors_[k] = gamma_obs_ * unobserved_powers_[k];
  }
}

EvidenceStore::EvidenceStore(const EvidenceStore& other) {
  std::shared_lock lock(other.mutex_);
  gamma_obs_ = other.gamma_obs_;
  gamma_unobs_ = other.gamma_unobs_;
  unobserved_powers_ = other.unobserved_powers_;
  observed_factors_ = other.observed_factors_;
  cells_ = other.cells_;
  max_value_ = other.max_value_;
}

EvidenceStore& EvidenceStore::operator=(const EvidenceStore& other) {
  if (this == &other) return *this;
  EvidenceStore copy(other);
  std::unique_lock lock(mutex_);
  gamma_obs_ = copy.gamma_obs_;
  gamma_unobs_ = copy.gamma_unobs_;
  unobserved_powers_ = std::move(copy.unobserved_powers_);
  observed_factors_ = std::move(copy.observed_factors_);
  cells_ = std::move(copy.cells_);
  max_value_ = copy.max_value_;
  return *this;
}

inline EvidenceCell EvidenceStore::updated(const EvidenceCell* cell, double success, double failure,
                                           int64_t version) const {
  if (cell == nullptr) return {success, failure, version};
  // Eq. 20 as one update, (S, F) <- keep * (S, F) + scale * (dS, dF):
  //   dv > 0: keep = gamma_obs * gamma_unobs^(dv-1), scale = 1;
  //   dv = 0: keep = scale = 1;
  //   dv < 0 (a late group from an older policy): keep = 1 and only the
  //           contribution is discounted, scale = gamma_obs * gamma_unobs^(|dv|-1);
  //           the cell keeps its newer version.
  // Multiplying by exactly 1 changes nothing, so each case rounds as its
  // textbook form does, while the sign of dv, which is unpredictable in a real
  // stream, selects values instead of branches.
  const int64_t dv = version - cell->version;
  const int64_t magnitude = dv < 0 ? -dv : dv;
  const int64_t steps = magnitude - 1 + static_cast<int64_t>(magnitude == 0);  // |dv| - 1, or 0
  const double choices[2] = {1.0, observed_decay(steps)};  // indexed by a bool: no branch
  const double keep = choices[dv > 0];
  const double scale = choices[dv < 0];
  return {keep * cell->success + scale * success, keep * cell->failure + scale * failure,
          std::max(cell->version, version)};
}

inline void EvidenceStore::apply(int64_t tag, int64_t rubric, double success, double failure,
                                 int64_t version) {
  auto [found, inserted] = cells_.find_or_insert(static_cast<uint64_t>(tag), static_cast<uint64_t>(rubric));
  *found = updated(inserted ? nullptr : found, success, failure, version);
  max_value_ = std::max(max_value_, std::max(found->success, found->failure));
}

void EvidenceStore::check_no_overflow(const int64_t* tags, const int64_t* rubrics, const double* successes,
                                      const double* failures, const int64_t* versions, size_t count,
                                      bool batch) const {
  // Fast path: keep and scale are at most 1, so no cell can end above
  // max_value_ + the call's whole contribution (summed in order, with headroom
  // for rounding).
  double total = max_value_;
  for (size_t i = 0; i < count; ++i) total += successes[i] + failures[i];
  if (total < 0x1p1020) return;
  // Exact dry run over the cells the call touches, in order, on copies.
  std::unordered_map<uint64_t, EvidenceCell> touched;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t key = (static_cast<uint64_t>(tags[i]) << 32) | static_cast<uint64_t>(rubrics[i]);
    auto it = touched.find(key);
    const EvidenceCell* cell = it != touched.end()
                                   ? &it->second
                                   : cells_.find(static_cast<uint64_t>(tags[i]), static_cast<uint64_t>(rubrics[i]));
    const EvidenceCell next = updated(cell, successes[i], failures[i], versions[i]);
    if (!std::isfinite(next.success) || !std::isfinite(next.failure)) {
      const bool success_side = !std::isfinite(next.success);
      std::string name = success_side ? (batch ? "successes" : "success") : (batch ? "failures" : "failure");
      if (batch) name += "[" + std::to_string(i) + "]";
      const double value = success_side ? successes[i] : failures[i];
      const double held = cell == nullptr ? 0.0 : (success_side ? cell->success : cell->failure);
      throw std::invalid_argument(
          name + " = " + describe(value) + " would make the evidence of cell (tag " + std::to_string(tags[i]) +
          ", rubric " + std::to_string(rubrics[i]) + "), holding " + describe(held) +
          ", overflow to infinity; refused" + (batch ? " (the whole call)" : "") + ", the store is unchanged");
    }
    touched[key] = next;
  }
}

void EvidenceStore::observe(int64_t tag, int64_t rubric, double success, double failure,
                            int64_t version) {
  check_id(tag, "tag");
  check_id(rubric, "rubric");
  check_evidence(success, "success");
  check_evidence(failure, "failure");
  check_version(version, "version");
  std::unique_lock lock(mutex_);
  check_no_overflow(&tag, &rubric, &success, &failure, &version, 1, false);
  apply(tag, rubric, success, failure, version);
}

void EvidenceStore::observe_many(const int64_t* tags, const int64_t* rubrics,
                                 const double* successes, const double* failures,
                                 const int64_t* versions, size_t count) {
  // Validate everything first so a bad element rejects the whole call. The
  // scan is a branch-free reduction over bit patterns (an id or version with a
  // high bit set is negative or too large; a double whose bits reach
  // 0x7FF0... is negative, -0.0, infinite or NaN); only when it flags
  // something are the elements checked one by one, to name the bad one.
  uint64_t id_bits = 0, version_bits = 0, evidence_bits = 0;
  for (size_t i = 0; i < count; ++i) {
    id_bits |= static_cast<uint64_t>(tags[i]) | static_cast<uint64_t>(rubrics[i]);
    version_bits |= static_cast<uint64_t>(versions[i]);
    uint64_t s, f;
    std::memcpy(&s, &successes[i], sizeof(s));
    std::memcpy(&f, &failures[i], sizeof(f));
    evidence_bits = std::max(evidence_bits, std::max(s, f));
  }
  const bool bad = (id_bits >> 32) != 0 || (version_bits >> 63) != 0 || evidence_bits >= 0x7FF0000000000000ULL;
  if (bad) {
    auto at = [](const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; };
    for (size_t i = 0; i < count; ++i) {
      check_id(tags[i], at("tags", i).c_str());
      check_id(rubrics[i], at("rubrics", i).c_str());
      check_evidence(successes[i], at("successes", i).c_str());
      check_evidence(failures[i], at("failures", i).c_str());
      check_version(versions[i], at("versions", i).c_str());
    }
  }
  std::unique_lock lock(mutex_);
  check_no_overflow(tags, rubrics, successes, failures, versions, count, true);
  for (size_t i = 0; i < count; ++i) apply(tags[i], rubrics[i], successes[i], failures[i], versions[i]);
}

Evidence EvidenceStore::decayed(const EvidenceCell& cell, int64_t version) const {
  // A query from before the last update sees the evidence undecayed rather
  // than inflated by a negative exponent.
  const int64_t dv = std::max<int64_t>(0, version - cell.version);
  const double factor = dv == 0 ? 1.0 : unobserved_decay(dv);
  return {cell.success * factor, cell.failure * factor};
}

Evidence EvidenceStore::query(int64_t tag, int64_t rubric, int64_t version) const {
  check_id(tag, "tag");
  check_id(rubric, "rubric");
  check_version(version, "version");
  std::shared_lock lock(mutex_);
  const EvidenceCell* cell = cells_.find(static_cast<uint64_t>(tag), static_cast<uint64_t>(rubric));
  return cell ? decayed(*cell, version) : Evidence{};
}

Evidence EvidenceStore::query_sum(int64_t tag, const int64_t* rubrics, size_t count,
                                  int64_t version) const {
  check_id(tag, "tag");
  check_version(version, "version");
  for (size_t i = 0; i < count; ++i) check_id(rubrics[i], "rubrics");
  std::shared_lock lock(mutex_);
  Evidence total;
  for (size_t i = 0; i < count; ++i) {
    const EvidenceCell* cell = cells_.find(static_cast<uint64_t>(tag), static_cast<uint64_t>(rubrics[i]));
    if (!cell) continue;
    const Evidence e = decayed(*cell, version);
    total.success += e.success;
    total.failure += e.failure;
  }
  return total;
}

void EvidenceStore::query_many(const int64_t* tags, const int64_t* rubrics, size_t count,
                               int64_t version, double* successes, double* failures) const {
  check_version(version, "version");
  for (size_t i = 0; i < count; ++i) {
    check_id(tags[i], "tags");
    check_id(rubrics[i], "rubrics");
  }
  std::shared_lock lock(mutex_);
  for (size_t i = 0; i < count; ++i) {
    const EvidenceCell* cell = cells_.find(static_cast<uint64_t>(tags[i]), static_cast<uint64_t>(rubrics[i]));
    const Evidence e = cell ? decayed(*cell, version) : Evidence{};
    successes[i] = e.success;
    failures[i] = e.failure;
  }
}

size_t EvidenceStore::remove_rubric(int64_t rubric) {
  check_id(rubric, "rubric");
  std::unique_lock lock(mutex_);
  return cells_.erase_rubric(static_cast<uint64_t>(rubric));
}

size_t EvidenceStore::size() const {
  std::shared_lock lock(mutex_);
  return cells_.size();
}

std::vector<std::pair<std::pair<int64_t, int64_t>, EvidenceCell>> EvidenceStore::cells() const {
  std::vector<std::pair<std::pair<int64_t, int64_t>, EvidenceCell>> out;
  {
    std::shared_lock lock(mutex_);
    out.reserve(cells_.size());
    cells_.for_each([&out](uint64_t tag, uint64_t rubric, const EvidenceCell& cell) {
      out.push_back({{static_cast<int64_t>(tag), static_cast<int64_t>(rubric)}, cell});
    });
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

std::string EvidenceStore::serialize() const {
  const auto sorted = cells();
  ByteWriter writer(kStoreMagic, kStoreFormat);
  writer.put<double>(gamma_obs_);
  writer.put<double>(gamma_unobs_);
  writer.put<uint64_t>(sorted.size());
  for (const auto& [ids, cell] : sorted) {
    writer.put<uint32_t>(static_cast<uint32_t>(ids.first));
    writer.put<uint32_t>(static_cast<uint32_t>(ids.second));
    writer.put<double>(cell.success);
    writer.put<double>(cell.failure);
    writer.put<int64_t>(cell.version);
  }
  return writer.finish();
}

EvidenceStore EvidenceStore::deserialize(const std::string& bytes, const std::string& what) {
  ByteReader reader(bytes, kStoreMagic, kStoreFormat, what);
  const double gamma_obs = reader.get<double>();
  const double gamma_unobs = reader.get<double>();
  if (!(gamma_obs > 0.0 && gamma_obs <= 1.0) || !(gamma_unobs > 0.0 && gamma_unobs <= 1.0))
    reader.fail("holds decay factors outside (0, 1]");
  EvidenceStore store(gamma_obs, gamma_unobs);
  const auto count = reader.get<uint64_t>();
  if (count > bytes.size()) reader.fail("declares an implausible cell count");
  uint64_t previous_key = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const auto tag = reader.get<uint32_t>();
    const auto rubric = reader.get<uint32_t>();
    // serialize() writes cells sorted by (tag, rubric): a strictly increasing
    // key also rules out duplicates.
    const uint64_t key = (static_cast<uint64_t>(tag) << 32) | rubric;
    if (i > 0 && key <= previous_key)
      reader.fail(key == previous_key ? "holds a duplicate cell" : "holds cells out of their canonical (tag, rubric) order");
    previous_key = key;
    EvidenceCell cell;
    cell.success = reader.get<double>();
    cell.failure = reader.get<double>();
    cell.version = reader.get<int64_t>();
    if (!std::isfinite(cell.success) || cell.success < 0 || !std::isfinite(cell.failure) ||
        cell.failure < 0 || cell.version < 0)
      reader.fail("holds an invalid evidence cell");
    auto [slot, inserted] = store.cells_.find_or_insert(static_cast<uint64_t>(tag), static_cast<uint64_t>(rubric));
    if (!inserted) reader.fail("holds a duplicate cell");
    *slot = cell;
    store.max_value_ = std::max(store.max_value_, std::max(cell.success, cell.failure));
  }
  reader.expect_end();
  return store;
}

}  // namespace rwcore
