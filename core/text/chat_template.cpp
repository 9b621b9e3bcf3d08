// SPDX-License-Identifier: Apache-2.0
#include "core/text/chat_template.h"

namespace batchlens::text {

namespace {

// Jinja's |trim: leading and trailing whitespace.
std::string_view trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const std::size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) {
    return {};
  }
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

std::string chat_prompt(std::string_view user_message, const ChatOptions& options) {
  std::string p = "<bos>";
  if (options.thinking || !trim(options.system).empty()) {
    p += "<|turn>system\n";
    if (options.thinking) {
      p += "<|think|>\n";
    }
    p += trim(options.system);
    p += "<turn|>\n";
  }
  p += "<|turn>user\n";
  p += trim(user_message);
  p += "<turn|>\n<|turn>model\n";
  if (!options.thinking) {
    p += "<|channel>thought\n<channel|>";
  }
  return p;
}

}  // namespace batchlens::text
