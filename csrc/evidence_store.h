// Decayed Beta evidence per (task-type tag, rubric): Arise eq. 20 / appendix B.5.
#pragma once

#include <cmath>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "cell_table.h"

namespace rwcore {

struct Evidence {
  double success = 0.0;
  double failure = 0.0;
};

// Thread-safe: writers take an exclusive lock, queries a shared one. Every
// public mutator validates all of its input before touching the store, so a
// rejected call leaves it unchanged; that includes evidence whose sum with a
// cell would overflow to infinity (refused, never stored).
class EvidenceStore {
 public:
  // Ids are unsigned 32-bit values so a (tag, rubric) pair packs into one 64-bit key.
  static constexpr int64_t kMaxId = (int64_t{1} << 32) - 1;

  EvidenceStore(double gamma_obs, double gamma_unobs);
  EvidenceStore(const EvidenceStore& other);
  EvidenceStore& operator=(const EvidenceStore& other);

  double gamma_obs() const { return gamma_obs_; }
  double gamma_unobs() const { return gamma_unobs_; }

  // Adds one observation (dS, dF) made by the policy at `version`.
  void observe(int64_t tag, int64_t rubric, double success, double failure, int64_t version);
  // The same as calling observe() for each index in order, under one lock.
  void observe_many(const int64_t* tags, const int64_t* rubrics, const double* successes,
                    const double* failures, const int64_t* versions, size_t count);

  // Evidence as seen by the policy at `version`; (0, 0) for an unseen pair.
  Evidence query(int64_t tag, int64_t rubric, int64_t version) const;
  Evidence query_sum(int64_t tag, const int64_t* rubrics, size_t count, int64_t version) const;
  void query_many(const int64_t* tags, const int64_t* rubrics, size_t count, int64_t version,
                  double* successes, double* failures) const;

  // Deletes every accumulator of `rubric`; returns how many there were.
  size_t remove_rubric(int64_t rubric);
  size_t size() const;

  // Cells sorted by (tag, rubric): a canonical order for snapshots and tests.
  std::vector<std::pair<std::pair<int64_t, int64_t>, EvidenceCell>> cells() const;

  std::string serialize() const;
  static EvidenceStore deserialize(const std::string& bytes, const std::string& what);

 private:
  void apply(int64_t tag, int64_t rubric, double success, double failure, int64_t version);
  // The cell after one observation (cell may be null: a new cell); pure, so a
  // dry run and the real update agree to the bit.
  EvidenceCell updated(const EvidenceCell* cell, double success, double failure, int64_t version) const;
  // Throws, naming the observation, if applying the `count` observations in
  // order would make any cell infinite. Call under the exclusive lock, before
  // changing anything.
  void check_no_overflow(const int64_t* tags, const int64_t* rubrics, const double* successes,
                         const double* failures, const int64_t* versions, size_t count, bool batch) const;
  Evidence decayed(const EvidenceCell& cell, int64_t version) const;
  // gamma_unobs^steps and gamma_obs * gamma_unobs^steps, from tables for the
  // common small step counts; the tables hold the very values the direct
  // computation gives, so both paths agree to the bit.
  static constexpr int64_t kPowerTableSize = 4096;
  double unobserved_decay(int64_t steps) const {
    return steps < kPowerTableSize ? unobserved_powers_[steps]
                                   : std::pow(gamma_unobs_, static_cast<double>(steps));
  }
  double observed_decay(int64_t steps) const {
    return steps < kPowerTableSize ? observed_factors_[steps] : gamma_obs_ * unobserved_decay(steps);
  }
  void fill_powers();

  double gamma_obs_;
  double gamma_unobs_;
  std::vector<double> unobserved_powers_;
  std::vector<double> observed_factors_;
  CellTable cells_;
  // An upper bound on every S and F in the store (never lowered by removals):
  // while it plus a call's total contribution stays far below DBL_MAX nothing
  // can overflow, and the exact per-cell dry run is skipped.
  double max_value_ = 0.0;
  mutable std::shared_mutex mutex_;
};

// Input checks shared with the sampler; each throws std::invalid_argument
// naming `name`.
void check_id(int64_t value, const char* name);
void check_version(int64_t value, const char* name);
void check_evidence(double value, const char* name);
void check_gamma(double value, const char* name);

}  // namespace rwcore
