// `pipesim sweep`: one row per point of the --grid product (docs/tune.md).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "commands.h"
#include "files.h"
#include "options.h"
#include "sweep.h"

namespace pipesim {
namespace {

struct SweepOptions {
  std::string config;
  std::vector<std::string> grids;  ///< key.path=v1,v2,...
  std::vector<std::string> overrides;
  Format format = Format::Text;
};

ExitStatus run_sweep(const SweepOptions& o) {
  Result<std::string> text = read_text_file(o.config);
  if (!text.ok()) return fail(text.error().message);
  Result<std::vector<GridAxis>> axes = parse_grids(o.grids, text.value(), o.config, o.overrides);
  if (!axes.ok()) return fail(axes.error().message);
  SweepTable table(axes.value(), o.format, [](std::string_view text) { fmt::print("{}", text); });
  sweep(text.value(), o.config, o.overrides, axes.value(), isatty(fileno(stderr)) && o.format == Format::Text,
        [&table](std::size_t index, SweepRow&& row) { table.add(index, row); });
  table.finish();
  if (!table.any_ran()) return fail("no point of the sweep could run; the error column says why");
  return ExitStatus::Success;
}

}  // namespace

void define_sweep(CLI::App& swp, ExitStatus& status) {
  auto o = std::make_shared<SweepOptions>();
  swp.add_option("config", o->config, "JSON config file")->required()->check(kNonEmpty);
  swp.add_option("--grid", o->grids,
                 "key.path=v1,v2,...: a --set key and its values; the rows are the product of the grids (repeatable)")
      ->required();
  swp.add_option("--set", o->overrides, "override a config field at every point: key.path=value (repeatable)");
  add_format_option(swp, o->format, {"text", "csv", "json", "markdown"});
  swp.callback([o, &status] { status = run_sweep(*o); });
}

}  // namespace pipesim
