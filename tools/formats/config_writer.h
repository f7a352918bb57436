#pragma once
/// Config -> JSON config: the inverse of parse_config, for a config pipesim worked out (tune's rows).
/// Every field is written, the hardware's included, so the file reads the same wherever it is moved and
/// whatever the presets' defaults become; includes (hf_config, hardware.file) are already expanded. The
/// one field left out is parallel.microbatches under training.global_batch_size, which makes it.
#include <nlohmann/json.hpp>
#include <string>

#include "config.h"

namespace pipesim {

/// `config` as a complete JSON config with `description` as its first key: parse_config of its text
/// gives back a config that plans and simulates the same (tests/config_test.cpp checks the round trip).
nlohmann::ordered_json config_json(const Config& config, const std::string& description);

/// precision.fp8 as a config spells it: null, or "hybrid" or "e4m3". The reports write the same.
nlohmann::ordered_json fp8_json(Fp8Format format);

}  // namespace pipesim
