// `pipesim compare`: every config x schedule x vocabulary mode, one row each.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "commands.h"
#include "compared_runs.h"
#include "options.h"

namespace pipesim {
namespace {

ExitStatus run_compare(const CompareSelection& o, Format format) {
  share_one_heap();
  Result<std::vector<RunReport>> reports = compare_runs(o, isatty(fileno(stderr)) && format == Format::Text);
  if (!reports.ok()) return fail(reports.error().message);
  fmt::print("{}", format_comparison(reports.value(), format));
  return ExitStatus::Success;
}

}  // namespace

void define_compare(CLI::App& cmp, ExitStatus& status) {
  auto o = std::make_shared<CompareSelection>();
  auto format = std::make_shared<Format>(Format::Text);
  add_compare_selection(cmp, *o);
  add_format_option(cmp, *format, {"text", "csv", "json", "markdown"});
  cmp.callback([o, format, &status] { status = run_compare(*o, *format); });
}

}  // namespace pipesim
