#pragma once

// Where a kvstrata binary finds what it needs when flags leave it out, in one place for the
// tool and the services:
//   cache folder   ${KVSTRATA_CACHE:-$HOME/.cache/kvstrata} (scripts/fetch-model.sh, fetch-text.sh)
//   default model  <cache>/models/SmolLM2-135M-Instruct.Q4_1.gguf
//   rotation files $KVSTRATA_ROTATIONS, else the repository's rotations/ folder

#include <string>

namespace kvstrata::engine {

std::string CacheDir();
std::string DefaultModelPath();
std::string DefaultRotationsDir();

}  // namespace kvstrata::engine
