// .npy reading and writing: round trips, headers as numpy writes them (versions 1 and 2), and
// refusals; a fuzz loop over random bytes and mutated headers (no crash, one-line errors).
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "distca/core/npy.h"
#include "distca/core/rng.h"

namespace distca {
namespace {

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file as numpy would write it, built by hand from the format description.
std::string handmade(const std::string& dict, const std::string& payload, int version = 1) {
  std::string header = dict;
  const size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  if (version == 1) {
    out += static_cast<char>(header.size() & 0xff);
    out += static_cast<char>(header.size() >> 8);
  } else {
    out += le32(static_cast<uint32_t>(header.size()));
  }
  return out + header + payload;
}

TEST(Npy, RoundTripFloatAndInt) {
  const std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  const auto bytes = npy_bytes(f.data(), {2, 1, 3});
  EXPECT_EQ((bytes.size() - f.size() * 4) % 64, 0u);  // header padded to 64 bytes
  auto a = parse_npy(bytes, "x");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->dtype, NpyDtype::kFloat32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(a->f32, f);

  const std::vector<int32_t> i = {0, 5, 5, 17};
  auto b = parse_npy(npy_bytes(i.data(), {4}), "cu");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype, NpyDtype::kInt32);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(b->i32, i);
  EXPECT_NE(npy_bytes(i.data(), {4}).find("'shape': (4,)"), std::string::npos);  // numpy's 1-tuple

  auto e = parse_npy(npy_bytes(f.data(), {0, 3}), "empty");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->size(), 0);
}

TEST(Npy, ReadsNumpyStyleHeaders) {
  std::string payload(8, '\0');
  const int32_t v[2] = {3, -4};
  std::memcpy(payload.data(), v, 8);
  auto a = parse_npy(handmade("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", payload), "a");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->i32, (std::vector<int32_t>{3, -4}));
  // Version 2 header, other key order, double quotes, no trailing comma.
  auto b = parse_npy(handmade("{\"shape\": (1, 2), \"fortran_order\": False, \"descr\": \"<i4\"}", payload, 2), "b");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->shape, (std::vector<int64_t>{1, 2}));
  // Scalar: shape ().
  auto c = parse_npy(handmade("{'descr': '<i4', 'fortran_order': False, 'shape': (), }", payload.substr(0, 4)), "c");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->size(), 1);
}

TEST(Npy, RefusesWhatItCannotRead) {
  const std::string p8(8, '\0');
  struct Bad {
    std::string bytes, needle;
  };
  const std::vector<Bad> cases = {
      {"not numpy at all", "magic"},
      {handmade("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", p8), "<f8"},
      {handmade("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", p8), ">f4"},
      {handmade("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", p8), "Fortran"},
      {handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", p8), "payload"},
      {handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", p8), "payload"},
      {handmade("{'descr': '<f4', 'fortran_order': False, }", p8), "shape"},
      {handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", p8), "shape"},
      {handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", p8), "shape"},
      {handmade("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", p8), "|O"},
      {std::string("\x93NUMPY\x01\x00\xff\x00{", 11), "truncated"},
      {std::string("\x93NUMPY\x07\x00\x10\x00", 10), "version"},
  };
  for (const auto& c : cases) {
    auto r = parse_npy(c.bytes, "'in.npy'");
    ASSERT_FALSE(r.ok()) << c.needle;
    const std::string& m = r.status().message();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_EQ(m.rfind("'in.npy': ", 0), 0u) << m;
    EXPECT_NE(m.find(c.needle), std::string::npos) << m;
  }
  auto missing = read_npy("/nonexistent/dir/x.npy");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/x.npy"), std::string::npos);
}

// Random bytes, then a valid file with random byte flips, truncations and insertions: the
// parser must return (ok or a one-line error) without crashing or reading out of bounds
// (run under ASan in the asan preset).
TEST(Npy, FuzzNeverCrashes) {
  Rng rng(2024);
  const std::vector<float> f = {1, 2, 3, 4, 5, 6};
  const std::string valid = npy_bytes(f.data(), {2, 3});
  int ok = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s;
    const uint64_t mode = rng.uniform_int(4);
    if (mode == 0) {
      s.resize(rng.uniform_int(200));
      for (auto& c : s) c = static_cast<char>(rng.uniform_int(256));
      if (rng.bernoulli(0.5) && s.size() >= 6) std::memcpy(s.data(), "\x93NUMPY", 6);
    } else {
      s = valid;
      const uint64_t edits = 1 + rng.uniform_int(4);
      for (uint64_t e = 0; e < edits && !s.empty(); ++e) {
        const size_t pos = rng.uniform_int(s.size());
        switch (rng.uniform_int(3)) {
          case 0: s[pos] = static_cast<char>(rng.uniform_int(256)); break;
          case 1: s.resize(pos); break;
          default: s.insert(pos, 1, "(),:'{} 0123456789"[rng.uniform_int(18)]); break;
        }
      }
    }
    auto r = parse_npy(s, "fuzz");
    if (r.ok()) {
      ++ok;
      EXPECT_EQ(static_cast<int64_t>(r->dtype == NpyDtype::kFloat32 ? r->f32.size() : r->i32.size()), r->size());
    } else {
      EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
    }
  }
  EXPECT_LT(ok, 20000);  // most mutations are refused
}

}  // namespace
}  // namespace distca
