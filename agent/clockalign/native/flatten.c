/* Byte records laid end to end: export/varbytes.flatten's one pass (the numpy path makes
 * a rows x width matrix and a mask of the same size, then compacts it).
 *
 * Part j of every record: bytes at b[j] + row * stride[j] (stride 0: the same bytes on
 * every row), nlen[j][row] of them, or nconst[j] where nlen[j] is NULL; absent on rows
 * where keep[j] is not NULL and keep[j][row] is 0.  Writes the records of rows 0..rows-1
 * in order into out (room for all of them: varbytes.total) and returns the bytes written.
 */
#include <stdint.h>
#include <string.h>

int64_t ca_flatten(int64_t rows, int32_t nparts, const uint8_t *const *b,
                   const int64_t *stride, const int64_t *nconst,
                   const int64_t *const *nlen, const uint8_t *const *keep, uint8_t *out)
{
    uint8_t *o = out;
    for (int64_t r = 0; r < rows; r++) {
        for (int32_t j = 0; j < nparts; j++) {
            if (keep[j] && !keep[j][r])
                continue;
            int64_t n = nlen[j] ? nlen[j][r] : nconst[j];
            const uint8_t *src = b[j] + r * stride[j];
            if (n == 1)
                *o = *src;
            else
                memcpy(o, src, (size_t)n);
            o += n;
        }
    }
    return (int64_t)(o - out);
}
