#!/usr/bin/env python3
# lanebus — MIT License.
# Embed a text file (the dashboard page) in a C++ header as a raw string:
#   embed_text.py INPUT OUTPUT NAME
import sys

src, out, name = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(src, encoding="utf-8").read()
delim = "LANEBUS_EMBED"
if ")" + delim + '"' in text:
    sys.exit(f"{src}: contains the raw string delimiter ){delim}\"")
with open(out, "w", encoding="utf-8") as f:
    f.write(f"// Generated from {src.split('/')[-1]} by lib/ops/embed_text.py at build time: do not edit.\n")
    f.write("#pragma once\n#include <string_view>\n\nnamespace lanebus::detail {\n")
    f.write(f'inline constexpr std::string_view {name} = R"{delim}(')
    f.write(text)
    f.write(f'){delim}";\n}}  // namespace lanebus::detail\n')
