#!/bin/sh
# Doxygen input filter for the C++ headers, which use plain // comments:
# a comment line before a declaration becomes a /// doc comment, and a
# trailing // comment after a member becomes ///<. The headers stay as they
# are; only what Doxygen reads changes.
exec sed -e 's|^\([[:space:]]*\)// |\1/// |' \
         -e 's|^\([[:space:]]*\)//$|\1///|' \
         -e 's|\([;,{]\)[[:space:]]*// |\1 ///< |' "$1"
