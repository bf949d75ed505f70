/*
 * Layout: the bytes a buffer takes in a core's memory. A layout written in the module is
 * honoured as written (tiles, element size, memory space); where none is written, the TPU's
 * default tiling applies. Only memory space 0 is HBM.
 */
#ifndef PODEMU_LAYOUT_H
#define PODEMU_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "hlo.h"

/* Saturation for sizes: far beyond any HBM, so that sums of a few million never wrap. */
#define LAYOUT_BYTES_CAP (INT64_MAX / 1024)

/*
 * Bytes of an array shape. tiled: the layout's first tile level when the text writes tiles
 * (XLA's ShapeUtil::ArraySize: the minor dimensions, in layout order, rounded up to the tile;
 * a tile longer than the rank pads missing dimensions of 1), else the TPU's default: minor two
 * dimensions in (8,128) tiles of 32-bit words (16-bit types packed two, 8-bit four to a word),
 * 1-D arrays in tiles of 1024 elements, scalars as they are. Not tiled: the unpadded size.
 * E(n) sets the bits per element. Tuples: the sum of their elements. Saturates at
 * LAYOUT_BYTES_CAP.
 */
int64_t layout_bytes(const struct hlo_shape *s, bool tiled);

/* True when the shape lives in HBM (memory space 0, or no layout). */
bool layout_in_hbm(const struct hlo_shape *s);

/* a + b, saturating at LAYOUT_BYTES_CAP (both non-negative). */
int64_t layout_add(int64_t a, int64_t b);

#endif
