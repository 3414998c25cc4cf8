#include "evidence_store.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "serialize.h"

namespace rwcore {
namespace {

constexpr char kStoreMagic[8] = {'R', 'W', 'E', 'V', 'S', 'T', 'O', 'R'};
constexpr uint32_t kStoreFormat = 1;

std::string describe(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return std::to_string(value);
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
}

EvidenceStore::EvidenceStore(const EvidenceStore& other) {
  std::shared_lock lock(other.mutex_);
  gamma_obs_ = other.gamma_obs_;
  gamma_unobs_ = other.gamma_unobs_;
  cells_ = other.cells_;
}

EvidenceStore& EvidenceStore::operator=(const EvidenceStore& other) {
  if (this == &other) return *this;
  EvidenceStore copy(other);
  std::unique_lock lock(mutex_);
  gamma_obs_ = copy.gamma_obs_;
  gamma_unobs_ = copy.gamma_unobs_;
  cells_ = std::move(copy.cells_);
  return *this;
}

void EvidenceStore::apply(int64_t tag, int64_t rubric, double success, double failure,
                          int64_t version) {
  auto [it, inserted] = cells_.try_emplace(key(tag, rubric));
  EvidenceCell& cell = it->second;
  if (inserted) {
    cell = {success, failure, version};
    return;
  }
  const int64_t dv = version - cell.version;
  if (dv > 0) {
    const double factor = gamma_obs_ * std::pow(gamma_unobs_, static_cast<double>(dv - 1));
    cell.success = factor * cell.success + success;
    cell.failure = factor * cell.failure + failure;
    cell.version = version;
  } else if (dv == 0) {
    cell.success += success;
    cell.failure += failure;
  } else {
    // A late group from an older policy: only its own contribution is
    // discounted, and the cell keeps its newer version.
    const double factor = gamma_obs_ * std::pow(gamma_unobs_, static_cast<double>(-dv - 1));
    cell.success += factor * success;
    cell.failure += factor * failure;
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
  apply(tag, rubric, success, failure, version);
}

void EvidenceStore::observe_many(const int64_t* tags, const int64_t* rubrics,
                                 const double* successes, const double* failures,
                                 const int64_t* versions, size_t count) {
  // Validate everything first so a bad element rejects the whole call.
  auto at = [](const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; };
  for (size_t i = 0; i < count; ++i) {
    if (tags[i] < 0 || tags[i] > kMaxId) check_id(tags[i], at("tags", i).c_str());
    if (rubrics[i] < 0 || rubrics[i] > kMaxId) check_id(rubrics[i], at("rubrics", i).c_str());
    if (!(successes[i] >= 0.0) || !std::isfinite(successes[i]))
      check_evidence(successes[i], at("successes", i).c_str());
    if (!(failures[i] >= 0.0) || !std::isfinite(failures[i]))
      check_evidence(failures[i], at("failures", i).c_str());
    if (versions[i] < 0) check_version(versions[i], at("versions", i).c_str());
  }
  std::unique_lock lock(mutex_);
  for (size_t i = 0; i < count; ++i) apply(tags[i], rubrics[i], successes[i], failures[i], versions[i]);
}

Evidence EvidenceStore::decayed(const EvidenceCell& cell, int64_t version) const {
  // A query from before the last update sees the evidence undecayed rather
  // than inflated by a negative exponent.
  const int64_t dv = std::max<int64_t>(0, version - cell.version);
  const double factor = dv == 0 ? 1.0 : std::pow(gamma_unobs_, static_cast<double>(dv));
  return {cell.success * factor, cell.failure * factor};
}

Evidence EvidenceStore::query(int64_t tag, int64_t rubric, int64_t version) const {
  check_id(tag, "tag");
  check_id(rubric, "rubric");
  check_version(version, "version");
  std::shared_lock lock(mutex_);
  auto it = cells_.find(key(tag, rubric));
  if (it == cells_.end()) return {};
  return decayed(it->second, version);
}

Evidence EvidenceStore::query_sum(int64_t tag, const int64_t* rubrics, size_t count,
                                  int64_t version) const {
  check_id(tag, "tag");
  check_version(version, "version");
  for (size_t i = 0; i < count; ++i) check_id(rubrics[i], "rubrics");
  std::shared_lock lock(mutex_);
  Evidence total;
  for (size_t i = 0; i < count; ++i) {
    auto it = cells_.find(key(tag, rubrics[i]));
    if (it == cells_.end()) continue;
    const Evidence e = decayed(it->second, version);
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
    auto it = cells_.find(key(tags[i], rubrics[i]));
    const Evidence e = it == cells_.end() ? Evidence{} : decayed(it->second, version);
    successes[i] = e.success;
    failures[i] = e.failure;
  }
}

size_t EvidenceStore::remove_rubric(int64_t rubric) {
  check_id(rubric, "rubric");
  std::unique_lock lock(mutex_);
  size_t removed = 0;
  for (auto it = cells_.begin(); it != cells_.end();) {
    if ((it->first & 0xFFFFFFFFULL) == static_cast<uint64_t>(rubric)) {
      it = cells_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
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
    for (const auto& [k, cell] : cells_)
      out.push_back({{static_cast<int64_t>(k >> 32), static_cast<int64_t>(k & 0xFFFFFFFFULL)}, cell});
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
  store.cells_.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const auto tag = reader.get<uint32_t>();
    const auto rubric = reader.get<uint32_t>();
    EvidenceCell cell;
    cell.success = reader.get<double>();
    cell.failure = reader.get<double>();
    cell.version = reader.get<int64_t>();
    if (!std::isfinite(cell.success) || cell.success < 0 || !std::isfinite(cell.failure) ||
        cell.failure < 0 || cell.version < 0)
      reader.fail("holds an invalid evidence cell");
    if (!store.cells_.emplace(key(tag, rubric), cell).second) reader.fail("holds a duplicate cell");
  }
  reader.expect_end();
  return store;
}

}  // namespace rwcore
