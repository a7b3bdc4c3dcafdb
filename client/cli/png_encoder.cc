// The minimal PNG encoder of the heatmaps (declared in html_report.h): an
// 8-bit palette image in stored deflate blocks, with CRC-32 and Adler-32,
// and base64 for its `data:` URI.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "client/cli/html_report.h"

namespace tensorcheck::cli {
namespace {

void AppendBigEndian32(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>((v >> 24) & 0xff));
  out->push_back(static_cast<char>((v >> 16) & 0xff));
  out->push_back(static_cast<char>((v >> 8) & 0xff));
  out->push_back(static_cast<char>(v & 0xff));
}

void AppendPngChunk(std::string* out, const char type[4], absl::string_view data) {
  AppendBigEndian32(out, static_cast<uint32_t>(data.size()));
  std::string body(type, 4);
  body.append(data.data(), data.size());
  out->append(body);
  AppendBigEndian32(out, Crc32(body));
}

}  // namespace

uint32_t Crc32(absl::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (char ch : data) c = table[(c ^ static_cast<unsigned char>(ch)) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t Adler32(absl::string_view data) {
  constexpr uint32_t kMod = 65521;
  uint32_t a = 1, b = 0;
  // 5552 is the most bytes before b can overflow 32 bits (zlib's NMAX).
  size_t i = 0;
  while (i < data.size()) {
    const size_t end = std::min(data.size(), i + 5552);
    for (; i < end; ++i) {
      a += static_cast<unsigned char>(data[i]);
      b += a;
    }
    a %= kMod;
    b %= kMod;
  }
  return (b << 16) | a;
}

std::string ZlibStored(absl::string_view data) {
  constexpr size_t kMaxBlock = 65535;
  std::string out;
  out.reserve(data.size() + data.size() / kMaxBlock * 5 + 16);
  // CMF 0x78 (deflate, 32K window), FLG 0x01: 0x7801 is a multiple of 31.
  out.push_back(static_cast<char>(0x78));
  out.push_back(static_cast<char>(0x01));
  size_t pos = 0;
  do {
    const size_t len = std::min(kMaxBlock, data.size() - pos);
    const bool last = pos + len == data.size();
    out.push_back(static_cast<char>(last ? 1 : 0));  // BFINAL, BTYPE 00 (stored)
    const uint16_t l = static_cast<uint16_t>(len), nl = static_cast<uint16_t>(~l);
    out.push_back(static_cast<char>(l & 0xff));
    out.push_back(static_cast<char>(l >> 8));
    out.push_back(static_cast<char>(nl & 0xff));
    out.push_back(static_cast<char>(nl >> 8));
    out.append(data.data() + pos, len);
    pos += len;
  } while (pos < data.size());
  AppendBigEndian32(&out, Adler32(data));
  return out;
}

std::string EncodePalettePng(int64_t width, int64_t height, absl::string_view indices,
                             absl::string_view palette) {
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  AppendBigEndian32(&ihdr, static_cast<uint32_t>(width));
  AppendBigEndian32(&ihdr, static_cast<uint32_t>(height));
  ihdr +=
      std::string("\x08\x03\x00\x00\x00", 5);  // 8-bit, palette, deflate, filter 0, no interlace
  AppendPngChunk(&png, "IHDR", ihdr);
  AppendPngChunk(&png, "PLTE", palette);
  std::string raw;
  raw.reserve(static_cast<size_t>(height * (width + 1)));
  for (int64_t y = 0; y < height; ++y) {
    raw.push_back('\0');  // filter: none
    raw.append(indices.data() + y * width, static_cast<size_t>(width));
  }
  AppendPngChunk(&png, "IDAT", ZlibStored(raw));
  AppendPngChunk(&png, "IEND", "");
  return png;
}

std::string Base64(absl::string_view data) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  size_t i = 0;
  auto byte = [&data](size_t k) {
    return static_cast<uint32_t>(static_cast<unsigned char>(data[k]));
  };
  for (; i + 3 <= data.size(); i += 3) {
    const uint32_t v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  if (i + 1 == data.size()) {
    const uint32_t v = byte(i) << 16;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out += "==";
  } else if (i + 2 == data.size()) {
    const uint32_t v = byte(i) << 16 | byte(i + 1) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back('=');
  }
  return out;
}

}  // namespace tensorcheck::cli
