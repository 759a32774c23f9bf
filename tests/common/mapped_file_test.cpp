// MappedFile and release_mapped_range: a released range of a live mapping reads back the file's
// bytes (the pages fault in again), and ranges outside every mapping are left alone.
#include "common/mapped_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace tessera {
namespace {

TEST(MappedFile, ReleasedPagesReadBackTheFile) {
  const std::string path = ::testing::TempDir() + "tessera_mapped_file_test.bin";
  std::vector<char> bytes(3 * 4096 + 123);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131 + 7) % 251);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto f = MappedFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  long sum = 0;
  for (size_t i = 0; i < f->size(); ++i) sum += f->data()[i];  // make every page resident
  EXPECT_GT(sum, 0);
  // An unaligned range in the middle, and the whole file.
  EXPECT_GE(release_mapped_range(f->data() + 5000, 6000), size_t{6000});
  for (size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(static_cast<char>(f->data()[i]), bytes[i]) << "byte " << i;
  EXPECT_GE(release_mapped_range(f->data(), f->size()), f->size());
  for (size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(static_cast<char>(f->data()[i]), bytes[i]) << "byte " << i;
  // Not in a mapping (heap memory, a range running past the file, null): nothing released.
  std::vector<uint8_t> heap(8192, 1);
  EXPECT_EQ(release_mapped_range(heap.data(), heap.size()), size_t{0});
  EXPECT_EQ(heap[100], 1);
  EXPECT_EQ(release_mapped_range(f->data() + 10, f->size()), size_t{0});
  EXPECT_EQ(release_mapped_range(nullptr, 10), size_t{0});
  // After the mapping is gone its range is unknown.
  const uint8_t* old = f->data();
  *f = MappedFile();
  EXPECT_EQ(release_mapped_range(old, 10), size_t{0});
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tessera
