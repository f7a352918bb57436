#pragma once
/// The shapes several launcher headers share (kernels.h, llama_kernels.h, vocab.h).
///
/// A launcher with more than a few operands takes its device pointers in a struct of its own
/// (`...Tensors`, declared beside it) and its sizes in shape structs like these. Their fields have no
/// default (AttentionShape::kv_heads aside): -Wextra's -Wmissing-field-initializers then catches a
/// call site that leaves one out, and designated initializers ({.x = ..., .y = ...}) must follow the
/// declared order.
#include "cpu/vocab.h"

namespace pipesim::runtime::cuda {

/// n rows of h elements, row-major: the row-wise launchers' shape (LayerNorm, RMSNorm, the
/// embedding) and the vocabulary passes' X, A, Y and dX.
struct RowShape {
  int n;  ///< rows: tokens (batch·seq, or a sequence-parallel rank's share of them)
  int h;  ///< elements per row: the hidden width
};

/// One device's rows [first, first + rows) of the vocabulary: of the embedding table and of the LM
/// head. The CPU runtime's struct, so a rank's shard passes to either backend as it is.
using VocabShard = cpu::VocabShard;

}  // namespace pipesim::runtime::cuda
