// ZeRO stage 1 (Rajbhandari et al. 2020) over a Communicator: each rank keeps the optimizer state
// of 1/N of the parameters. The parameters are flattened into buckets (about 25 MB, in the order
// backward produces their gradients, each padded to a multiple of N elements); rank r owns chunk r
// of every bucket. During backward each bucket's gradients are reduce-scattered (averaged) as soon
// as they are all ready, so a rank receives the averaged gradients of its chunks only; its
// optimizer updates its chunks (1-D views of the flat parameters, one per group and bucket, so a
// group's hyper-parameters hold for all of a view); then every bucket is all-gathered and every
// rank holds the new parameters. Traffic per step is that of one all-reduce. A parameter's own
// .grad is released once its bucket has copied it, and a bucket's full flat once its reduce-scatter
// has finished (polled as the next bucket goes out; this rank's chunk is what remains), so after
// finish() the model's parameters hold no gradients: read the shard views'.
//
//   dist::ZeroRedundancy zero(model, optim::decay_groups(...), comm);
//   optim::AdamW opt(zero.shard_groups());           // state for this rank's chunks only
//   loss.backward(); zero.finish();                   // this rank's averaged gradient chunks
//   zero.clip_grad_norm(1.0);                         // the global norm (optional)
//   opt.step(); zero.gather();                        // everyone gets everyone's update
//
// Element-wise optimizers only (SGD, AdamW): LAMB's trust ratio is per whole tensor.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist.h"
#include "engine/optim.h"

namespace kiln::dist {

// Where every parameter lies in the flat buckets: what a sharded checkpoint records, so that a
// resume can check it and `kiln ckpt consolidate` can give every parameter its own state again.
struct ZeroLayout {
  struct Entry {
    std::string name;       // the parameter's name in the model
    size_t group, index;    // its optimizer group and index there (the unsharded state's names)
    int64_t offset, numel;  // in the bucket's flat
    bool operator==(const Entry&) const = default;
  };
  struct Bucket {
    int64_t chunk = 0;  // elements per rank; the flat holds world_size * chunk
    std::vector<Entry> params;
    bool operator==(const Bucket&) const = default;
  };
  int world_size = 1;
  std::vector<Bucket> buckets;
  bool operator==(const ZeroLayout&) const = default;
};

class ZeroRedundancy {
 public:
  // `groups` are the optimizer's groups over `model`'s parameters (f32, contiguous, one device);
  // every parameter that requires grad must be in exactly one. Checks that every rank built the
  // same model and copies rank 0's parameters and buffers to all, as DataParallel does. The
  // parameters' storage moves into the flat buckets (their values and the Module's handles stay).
  ZeroRedundancy(nn::Module& model, const std::vector<optim::ParamGroup>& groups, Communicator& comm,
                 DataParallelOptions o = {});
  ~ZeroRedundancy();
  ZeroRedundancy(const ZeroRedundancy&) = delete;
  ZeroRedundancy& operator=(const ZeroRedundancy&) = delete;

  // This rank's chunks as optimizer groups: one per given group (its lr, weight decay and name),
  // holding 1-D views of the flat parameters. Build the optimizer from these.
  std::vector<optim::ParamGroup> shard_groups() const;
  // The same views, in one list (for clipping, loss-scaler unscaling and the optimizer step).
  const std::vector<Tensor>& shard_params() const { return views_; }

  // Gradient accumulation: with sync off, backward only accumulates into the model's gradients.
  void set_sync(bool on) { sync_ = on; }
  // Waits for every bucket's reduce-scatter; each view's .grad is then this rank's chunk of the
  // gradients averaged over ranks.
  void finish();
  // clip_grad_norm over the views with the norm of all ranks' chunks together (optim::clip_grad_norm
  // with the squares all-reduced).
  Tensor clip_grad_norm(double max_norm);
  // After the optimizer step: all-gathers every bucket, so every rank holds every update.
  void gather();
  // Clears the model's gradients (the views' are the optimizer's zero_grad).
  void zero_grad();
  double take_wait_seconds();
  int64_t num_buckets() const { return int64_t(buckets_.size()); }

  // ---- checkpoints: the optimizer state of every rank, one flat tensor per bucket and slot in
  // the flat parameters' layout ("zero.<bucket>.<slot>"), and the layout itself.
  // The entries a checkpoint holds, each made by an all-gather when called: a collective, so
  // every rank calls every make() once, in this order (rank 0 writes what they return).
  std::vector<std::pair<std::string, std::function<Tensor()>>> state_entries(const optim::Optimizer& opt) const;
  // This rank's optimizer state (names as `opt` over shard_groups() expects) from those entries,
  // read through `read` (the checkpoint's tensor by name); a layout other than this one (another
  // world size or model) is an error.
  optim::OptimizerState local_state(const std::function<Tensor(const std::string&)>& read,
                                    const std::vector<std::string>& slots, const ZeroLayout& saved,
                                    const std::string& what) const;
  // This rank's optimizer state from an unsharded one (names "<group>.<index>.<slot>" of the same
  // optimizer over the whole parameters, as a DataParallel run or `kiln ckpt consolidate` writes).
  optim::OptimizerState local_state_from_whole(const optim::OptimizerState& whole, const std::string& what) const;
  const ZeroLayout& layout() const { return layout_; }

 private:
  struct Piece {   // one parameter's place in a bucket
    size_t param;  // index into params_
    int64_t offset, numel;
  };
  struct Bucket {
    std::vector<Piece> pieces;  // grouped by optimizer group, then in gradient order
    int64_t numel = 0, chunk = 0;
    int pending = 0;
    Tensor flat;               // the parameters, world * chunk elements
    Tensor grads, grad_chunk;  // during a reduce-scatter
    std::shared_ptr<Work> work;
  };
  struct View {  // one of this rank's optimizer tensors
    size_t bucket, group;
    int64_t offset, numel;  // in the bucket's flat
  };
  void on_grad_ready(size_t index);
  void launch(Bucket& b);

  nn::Module& model_;
  Communicator& comm_;
  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::pair<size_t, size_t>> group_of_;  // params_ index -> (group, index in group)
  std::vector<optim::ParamGroup> groups_;            // the given groups' settings
  std::vector<int> hook_ids_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<View> view_info_;
  std::vector<Tensor> views_;
  ZeroLayout layout_;
  bool sync_ = true;
  double wait_seconds_ = 0;
};

// The inverse: an unsharded optimizer state (every parameter's own tensors, shaped by `shape_of`)
// from a sharded checkpoint's flats, read through `read` ("zero.<bucket>.<slot>").
optim::OptimizerState whole_optimizer_state(const std::function<Tensor(const std::string&)>& read,
                                            const std::vector<std::string>& slots, const ZeroLayout& layout,
                                            const std::function<Shape(const std::string& param)>& shape_of);

}  // namespace kiln::dist
