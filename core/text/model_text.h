// SPDX-License-Identifier: Apache-2.0
// The tokenizer that goes with a model source. Torch-free.
#pragma once

#include "core/base/error.h"
#include "core/model/loader.h"
#include "core/text/tokenizer.h"

namespace batchlens::text {

/// <checkpoint>/tokenizer.json for a checkpoint directory; for a preset, the tokenizer the
/// project generates for its vocabulary (preset_tokenizer_json, built once per size and
/// cached). Errors: FileNotFound (a checkpoint directory without tokenizer.json: use token
/// ids instead), those of Tokenizer::from_file, InvalidArgument (unknown preset). Thread-safe.
base::Result<Tokenizer> tokenizer_for(const model::ModelSource& source);

}  // namespace batchlens::text
