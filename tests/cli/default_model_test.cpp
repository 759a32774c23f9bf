// Where commands find the default model when no --model is given (cli/default_model.h).
#include "cli/default_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

class DefaultModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tessera_default_model_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    // A repository layout: <repo>/build/bin holds the executable, <repo>/models the model;
    // <work> is some other current directory.
    fs::create_directories(root_ / "repo" / "build" / "bin");
    fs::create_directories(root_ / "work");
    search_.working_dir = (root_ / "work").string();
    search_.executable_dir = (root_ / "repo" / "build" / "bin").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  static std::string touch(const fs::path& p) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "GGUF";
    return p.lexically_normal().string();
  }

  fs::path root_;
  DefaultModelSearch search_;
};

TEST_F(DefaultModelTest, NoneFoundNamesThePlacesAndTheFix) {
  auto r = resolve_default_model(search_);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  const std::string m = r.status().message();
  EXPECT_NE(m.find("scripts/quickstart.sh"), std::string::npos) << m;
  EXPECT_NE(m.find("--model"), std::string::npos) << m;
  EXPECT_NE(m.find((root_ / "work" / "models").string()), std::string::npos) << m;
  EXPECT_NE(m.find((root_ / "repo" / "models").string()), std::string::npos) << m;
}

TEST_F(DefaultModelTest, BesideTheBuildDirectory) {
  const std::string repo_model = touch(root_ / "repo" / "models" / std::string(kDefaultModelFile));
  auto r = resolve_default_model(search_);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, repo_model);
}

TEST_F(DefaultModelTest, WorkingDirectoryBeforeTheBuildDirectory) {
  touch(root_ / "repo" / "models" / std::string(kDefaultModelFile));
  const std::string here = touch(root_ / "work" / "models" / std::string(kDefaultModelFile));
  auto r = resolve_default_model(search_);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, here);
}

TEST_F(DefaultModelTest, EnvironmentVariableFirst) {
  touch(root_ / "work" / "models" / std::string(kDefaultModelFile));
  search_.env_model = touch(root_ / "elsewhere" / "my.gguf");
  auto r = resolve_default_model(search_);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, search_.env_model);
}

TEST_F(DefaultModelTest, MissingEnvironmentModelIsAnErrorNotSkipped) {
  touch(root_ / "work" / "models" / std::string(kDefaultModelFile));
  search_.env_model = (root_ / "nowhere.gguf").string();
  auto r = resolve_default_model(search_);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("TESSERA_MODEL"), std::string::npos) << r.status().message();
}

TEST_F(DefaultModelTest, ProcessSearchReadsTheEnvironment) {
  const std::string model = touch(root_ / "env.gguf");
  ::setenv("TESSERA_MODEL", model.c_str(), 1);
  std::string flag;
  const Status s = resolve_model_flag(flag);
  ::unsetenv("TESSERA_MODEL");
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(flag, model);
  EXPECT_FALSE(default_model_search().executable_dir.empty());
}

TEST_F(DefaultModelTest, GivenModelIsKept) {
  std::string flag = "some/dir";
  ::setenv("TESSERA_MODEL", "/nonexistent.gguf", 1);
  const Status s = resolve_model_flag(flag);
  ::unsetenv("TESSERA_MODEL");
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(flag, "some/dir");
}

}  // namespace
}  // namespace tessera::cli
