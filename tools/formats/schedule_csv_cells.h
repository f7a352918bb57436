#pragma once
/// The cells of PyTorch's schedule CSV (torch.distributed.pipelining, `_Action.__repr__`), one at a
/// time: `{stage}{type}{microbatch}` with type F, I, B or W (compute), SEND_F, RECV_F, SEND_B or
/// RECV_B (the compute_comms format), UNSHARD, RESHARD or REDUCE_GRAD (no microbatch); an empty
/// cell (an idle step); or `(0F7;7B3)OVERLAP_F_B`, a forward and a full backward run together.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pipesim {

struct CsvAction {
  int stage = 0;
  std::string_view type;  ///< one of the types above, pointing into a static table
  int microbatch = -1;    ///< -1 for UNSHARD, RESHARD and REDUCE_GRAD
  bool compute() const { return type.size() == 1; }
  bool transfer() const { return type.starts_with("SEND_") || type.starts_with("RECV_"); }
};

/// What to write instead, for error messages.
inline constexpr std::string_view kCsvGrammar =
    "write [stage][F|I|B|W][microbatch] (e.g. 0F0), [stage][SEND_F|RECV_F|SEND_B|RECV_B][microbatch], "
    "[stage][UNSHARD|RESHARD|REDUCE_GRAD] or ([action];[action])OVERLAP_F_B";

/// The cell without surrounding blanks.
std::string_view trim_csv_cell(std::string_view cell);

/// The actions of one cell (none for an empty cell, two for OVERLAP_F_B); nullopt if malformed.
std::optional<std::vector<CsvAction>> parse_csv_cell(std::string_view cell);

}  // namespace pipesim
