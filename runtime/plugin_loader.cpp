#include "plugin_loader.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>

namespace pipesim::runtime {

const void* load_plugin(const PluginSpec& spec, std::string& error) {
  const char* from_env = std::getenv(spec.env);
  const std::string path = from_env && *from_env ? from_env : spec.built_path;
  if (path.empty()) {
    error = spec.not_built;
    return nullptr;
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | (spec.global ? RTLD_GLOBAL : RTLD_LOCAL));
  if (!handle) {
    error = fmt::format("cannot load {} {}: {}; rebuild pipesim (ninja -C build), set {} to the plugin file, or {}",
                        spec.what, path, dlerror(), spec.env, spec.instead);
    return nullptr;
  }
  // The handle stays open for the process's life: the plugin's code is in use until exit.
  const auto entry = reinterpret_cast<const void* (*)()>(dlsym(handle, spec.entry));
  const void* table = entry ? entry() : nullptr;
  if (!table || *static_cast<const int*>(table) != spec.version) {
    error = fmt::format("{} is not this pipesim's {} (no {} of version {}); rebuild pipesim (ninja -C build) or point "
                        "{} at the matching file",
                        path, spec.what, spec.entry, spec.version, spec.env);
    return nullptr;
  }
  return table;
}

}  // namespace pipesim::runtime
