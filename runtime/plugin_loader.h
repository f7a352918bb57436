#pragma once
/// Loading a backend plugin: a shared module next to the build, opened with dlopen on first use.
/// Backends whose libraries are heavy at start-up (CUDA's, MPI's) are plugins, so that commands
/// that never run on them -- `pipesim list`, `simulate`, `tune` -- do not load them.
#include <string>

namespace pipesim::runtime {

/// The plugins pipesim has; what each one is (its file, variable, entry and version) is described
/// once, in plugin_loader.cpp's table.
enum class Plugin { Cuda, Mpi };

struct PluginSpec {
  const char* what;        ///< names it in messages: "the CUDA backend"
  const char* env;         ///< a variable that names another plugin file (an installed copy, say)
  const char* built_path;  ///< the file this build made; empty when the build has none
  const char* not_built;   ///< the message for a build without it
  const char* instead;     ///< what the user can do instead: "run with --backend cpu"
  const char* entry;       ///< the one exported symbol: a function returning the plugin's table
  int version;             ///< the table's first member must equal this: a stale plugin is refused
  bool global;             ///< RTLD_GLOBAL: the plugin's libraries load components of their own
};

/// The plugin's table (a standard-layout struct whose first member is `int version`), or null and
/// `error` saying why and what to do.
const void* load_plugin(Plugin plugin, std::string& error);

}  // namespace pipesim::runtime
