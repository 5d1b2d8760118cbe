// The body shared by the C testbenches tb_dense_int8.cpp and tb_lstm_int8.cpp: each defines TB_TOP (the
// HLS top), TB_KIND (1 dense, 2 LSTM: the vector file's kind), TB_NAME and TB_DEFAULT_FILE, then
// includes this file. See tb_dense_int8.cpp for the file format and the exit status.
#ifndef EDGEHFT_TB_COMMON_H
#define EDGEHFT_TB_COMMON_H
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

bool read_all(FILE* f, void* dst, size_t n) { return n == 0 || std::fread(dst, 1, n, f) == n; }

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : TB_DEFAULT_FILE;
  FILE* f = std::fopen(path, "rb");
  uint32_t head[3];
  if (!f || !read_all(f, head, sizeof head) || head[0] != 0x56544845u || head[1] != TB_KIND) {
    std::printf("%s tb: cannot read vectors %s\n", TB_NAME, path);
    return 2;
  }
  bool loaded[64] = {false};
  int failures = 0;
  for (uint32_t c = 0; c < head[2]; c++) {
    uint32_t m[6];  // slot, rows (steps), n_in, n_out (n_hidden), weight bytes, params words
    if (!read_all(f, m, sizeof m)) { std::printf("%s tb: truncated at case %u\n", TB_NAME, c); return 2; }
    const uint32_t slot = m[0], rows = m[1], n_in = m[2], n_out = m[3];
    std::vector<int8_t> w(m[4]), x(rows * n_in), want(rows * n_out), y(rows * n_out);
    std::vector<int32_t> p(m[5]);
    if (!read_all(f, w.data(), w.size()) || !read_all(f, p.data(), 4 * p.size()) ||
        !read_all(f, x.data(), x.size()) || !read_all(f, want.data(), want.size())) {
      std::printf("%s tb: truncated at case %u\n", TB_NAME, c);
      return 2;
    }
    bool ok = true;
    if (slot < 64 && !loaded[slot]) {  // mode 1 before mode 0 is refused: y stays as it was
      for (auto& v : y) v = 0x5A;
      TB_TOP(1, rows, n_in, n_out, nullptr, nullptr, x.data(), y.data(), slot);
      for (auto v : y) ok = ok && v == 0x5A;
      if (!ok) std::printf("%s tb: case %u: mode 1 on unloaded slot %u wrote y\n", TB_NAME, c, slot);
    }
    TB_TOP(0, rows, n_in, n_out, w.data(), p.data(), nullptr, nullptr, slot);
    if (slot < 64) loaded[slot] = true;
    for (int rep = 0; rep < 2; rep++) {  // twice: nothing carries over between calls
      for (auto& v : y) v = 0x5A;
      TB_TOP(1, rows, n_in, n_out, nullptr, nullptr, x.data(), y.data(), slot);
      uint32_t bad = 0, first = 0;
      for (uint32_t i = 0; i < y.size(); i++)
        if (y[i] != want[i] && bad++ == 0) first = i;
      if (bad) {
        std::printf("%s tb: case %u call %d: %u of %zu outputs differ (first at %u: got %d, want %d)\n",
                    TB_NAME, c, rep, bad, y.size(), first, y[first], want[first]);
        ok = false;
      }
    }
    failures += ok ? 0 : 1;
  }
  std::fclose(f);
  std::printf("%s tb: %u cases, %d failed\n", TB_NAME, head[2], failures);
  return failures ? 1 : 0;
}

#endif  // EDGEHFT_TB_COMMON_H
