// A complete binary tree of non-negative weights for O(log n) weighted draws.
//
// Every inner node is recomputed as left + right whenever a leaf below it
// changes, never adjusted by a difference, so the tree is a pure function of its
// leaves: no drift over millions of updates, and a tree rebuilt after a resume
// draws exactly as the original did.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace rwcore {

class SumTree {
 public:
  explicit SumTree(size_t size = 0) { resize(size); }

  void resize(size_t size) {
    size_ = size;
    capacity_ = 1;
    while (capacity_ < size) capacity_ <<= 1;
    nodes_.assign(2 * capacity_, 0.0);
  }

  size_t size() const { return size_; }
  double total() const { return nodes_[1]; }
  double weight(size_t index) const { return nodes_[capacity_ + index]; }

  void set(size_t index, double weight) {
    size_t node = capacity_ + index;
    nodes_[node] = weight;
    for (node >>= 1; node >= 1; node >>= 1) nodes_[node] = nodes_[2 * node] + nodes_[2 * node + 1];
  }

  // Sets all leaves at once and rebuilds the inner nodes bottom-up.
  void assign(const std::vector<double>& weights) {
    std::fill(nodes_.begin(), nodes_.end(), 0.0);
    for (size_t i = 0; i < weights.size(); ++i) nodes_[capacity_ + i] = weights[i];
    for (size_t node = capacity_ - 1; node >= 1; --node)
      nodes_[node] = nodes_[2 * node] + nodes_[2 * node + 1];
  }

  // The leaf whose cumulative weight interval contains `target`, which must be
  // in [0, total()) and total() > 0. Rounding can leave `target` past the
  // last positive leaf of a subtree; the descent then never enters an empty
  // subtree, so a zero-weight leaf is never returned.
  size_t find(double target) const {
    size_t node = 1;
    while (node < capacity_) {
      const double left = nodes_[2 * node];
      const double right = nodes_[2 * node + 1];
      if ((target < left && left > 0.0) || right <= 0.0) {
        node = 2 * node;
      } else {
        target -= left;
        node = 2 * node + 1;
      }
    }
    return node - capacity_;
  }

 private:
  size_t size_ = 0;
  size_t capacity_ = 1;
  std::vector<double> nodes_;
};

}  // namespace rwcore
