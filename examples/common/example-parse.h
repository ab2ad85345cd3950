/* Numbers, sizes and durations as the examples' options and files write them: the project's own
 * parser (common/parse-util.c, which this folder's library builds in), so that an example reads
 * a size as aquad, aquactl and aqua.vllm do (README.md, "Sizes"). It uses the C library alone: an
 * example copied out of the tree takes parse-util.c and parse-util.h with it. */
#pragma once

#include "../../common/parse-util.h"
