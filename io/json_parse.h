// JSON from files Kiln did not write itself (safetensors headers, checkpoint manifests), parsed with
// a limit on how deeply arrays and objects nest. nlohmann's parser keeps a frame per level and its
// dump(), comparisons and copies recurse, so a hostile file of 100000 '[' would otherwise exhaust the
// parser's memory or overflow the stack (a crash, not an error) in whatever touches the value next.
#pragma once
#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace kiln::io {

// nlohmann's parser callback, minus the depth and the keep/discard result: called for every event
// (keys, values, starts and ends of objects and arrays) after the depth check; it may throw.
using JsonEventHook = std::function<void(nlohmann::json::parse_event_t event, nlohmann::json& parsed)>;

// Parses text[0, n). Nesting deeper than `max_depth` levels (the root object or array is level 1) is
// an Error "<too_deep()>"; invalid JSON is an Error "<not_json>: <nlohmann's message>".
nlohmann::json parse_json_bounded(const char* text, size_t n, int max_depth,
                                  const std::function<std::string()>& too_deep, const std::string& not_json,
                                  const JsonEventHook& hook = {});

}  // namespace kiln::io
