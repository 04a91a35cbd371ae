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

// A JSON file a user writes by hand (kiln train --config, a Hugging Face config.json), parsed whole:
// content after the value is an error, and so is a key repeated within one object (nlohmann keeps the
// last, silently). Errors start with `what`: "<what>: not valid JSON: <nlohmann's message, with the
// line>", "<what>: key 'k' appears twice (one key per setting; JSON keeps only the last)", or, within
// an object that is a key's value, "... appears twice in 'owner'". Nests at most 64 levels.
nlohmann::json parse_json_file_text(const std::string& text, const std::string& what);

}  // namespace kiln::io
