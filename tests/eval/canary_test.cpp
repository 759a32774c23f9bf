// Generation canaries (eval/canary.h): where a code completion is cut, when a math answer
// matches, and the sandbox that runs the programs: a passing program, a failing test, a syntax
// error, an endless loop, a memory bomb, a big file, an empty environment and directory. The
// sandbox needs a Python 3 interpreter; those tests skip without one.
#include "eval/canary.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"

namespace tessera {
namespace {

// The message `text` holds `part` (printed whole when it does not).
#define EXPECT_CONTAINS(text, part)                                                  \
  EXPECT_NE(std::string(text).find(part), std::string::npos)                         \
      << "expected \"" << (part) << "\" in:\n" << (text)

TEST(CutCodeCompletion, StopsAtTheFirstLineAtColumnZero) {
  struct Case {
    const char* completion;
    const char* want;
  };
  const Case cases[] = {
      {"", ""},
      {"    return x + 1", "    return x + 1"},                         // no newline: all of it
      {"    return x + 1\n", "    return x + 1\n"},
      {"    a = 1\n    return a\n", "    a = 1\n    return a\n"},       // the body stays
      {"    a = 1\n\n    return a\n", "    a = 1\n\n    return a\n"},   // blank lines inside
      {"    return x\n\ndef foo():\n    pass\n", "    return x\n\n"},    // a new def
      {"    return x\nclass A:\n", "    return x\n"},
      {"    return x\nprint(f(1))\n", "    return x\n"},
      {"    return x\nif __name__ == '__main__':\n", "    return x\n"},
      {"    return x\n# a comment\n", "    return x\n"},
      {"\treturn x\n\tpass\nx = 1", "\treturn x\n\tpass\n"},             // tabs indent too
      {"    return x\r\n\r\n    y\n", "    return x\r\n\r\n    y\n"},   // CRLF blank lines
      {"x = 1\ny = 2\n", "x = 1\n"},                                     // the first line is kept
      {"    return x\n)", "    return x\n"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(std::string(c.completion)));
    EXPECT_EQ(cut_code_completion(c.completion), c.want);
  }
}

TEST(MathAnswerMatches, FirstLineTrimmedIsTheAnswer) {
  struct Case {
    const char* completion;
    const char* answer;
    bool match;
  };
  const Case cases[] = {
      {"42", "42", true},
      {" 42", "42", true},
      {"42.", "42", true},
      {"42..\n", "42", true},
      {"  42 \r\nThe next question", "42", true},
      {"\t-7\n", "-7", true},
      {"4.5", "4.5", true},
      {"42\n43", "42", true},
      {"420", "42", false},
      {"4 2", "42", false},
      {"42 apples", "42", false},
      {"The answer is 42", "42", false},
      {"\n42", "42", false},  // the first line is empty
      {"", "42", false},
      {"   ", "", false},      // an empty line never matches, even an empty answer
      {"43", "42", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(std::string(c.completion)) + " vs " + c.answer);
    EXPECT_EQ(math_answer_matches(c.completion, c.answer), c.match);
  }
}

bool have_python3() { return std::system("python3 -c 'import resource' > /dev/null 2>&1") == 0; }

#define SKIP_WITHOUT_PYTHON3() \
  if (!have_python3()) GTEST_SKIP() << "no python3 on PATH: the canary sandbox needs one"

TEST(RunCodePrograms, NoProgramsNeedNoInterpreter) {
  auto v = run_code_programs({}, "/nonexistent/python", SandboxLimits{});
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_TRUE(v->empty());
}

TEST(RunCodePrograms, AMissingInterpreterIsNamed) {
  auto v = run_code_programs({{"p", "x = 1\n", ""}}, "tessera-no-such-python", SandboxLimits{});
  ASSERT_FALSE(v.is_ok());
  EXPECT_CONTAINS(v.status().message(), "tessera-no-such-python");
}

TEST(RunCodePrograms, VerdictsInOrder) {
  SKIP_WITHOUT_PYTHON3();
  const std::string add = "def add(a, b):\n    return a + b\n";
  const std::vector<CodeProgram> programs = {
      {"pass", add, "assert add(2, 3) == 5\n"},
      {"fail", "def add(a, b):\n    return a - b\n", "assert add(2, 3) == 5, 'add is wrong'\n"},
      {"syntax", "def add(a, b):\n    return a +\n", "assert add(2, 3) == 5\n"},
      {"raises", add, "raise ValueError('boom')\n"},
      {"exit", add, "import sys\nsys.exit(3)\n"},
      // HumanEval's shape: the test defines check(), the runner calls it.
      {"humaneval", add, "def check(candidate):\n    assert candidate(1, 1) == 2\n\ncheck(add)\n"},
  };
  SandboxLimits limits;
  limits.timeout_s = 10;
  auto v = run_code_programs(programs, "python3", limits);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_EQ(v->size(), programs.size());
  const CodeVerdict& pass = (*v)[0];
  EXPECT_TRUE(pass.parses);
  EXPECT_TRUE(pass.passed) << pass.detail;
  EXPECT_EQ(pass.detail, "");

  const CodeVerdict& fail = (*v)[1];
  EXPECT_TRUE(fail.parses);
  EXPECT_FALSE(fail.passed);
  EXPECT_CONTAINS(fail.detail, "AssertionError");
  EXPECT_CONTAINS(fail.detail, "add is wrong");

  const CodeVerdict& syntax = (*v)[2];
  EXPECT_FALSE(syntax.parses);
  EXPECT_FALSE(syntax.passed);
  EXPECT_CONTAINS(syntax.detail, "SyntaxError");
  EXPECT_CONTAINS(syntax.detail, "line 2");

  EXPECT_TRUE((*v)[3].parses);
  EXPECT_FALSE((*v)[3].passed);
  EXPECT_CONTAINS((*v)[3].detail, "ValueError: boom");

  EXPECT_FALSE((*v)[4].passed);
  EXPECT_CONTAINS((*v)[4].detail, "exit status 3");

  EXPECT_TRUE((*v)[5].passed) << (*v)[5].detail;
}

TEST(RunCodePrograms, AnEndlessLoopTimesOut) {
  SKIP_WITHOUT_PYTHON3();
  SandboxLimits limits;
  limits.timeout_s = 1;
  const auto start = std::chrono::steady_clock::now();
  auto v = run_code_programs({{"loop", "def f():\n    while True:\n        pass\n", "f()\n"},
                              {"after", "x = 1\n", "assert x == 1\n"}},
                             "python3", limits);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_EQ(v->size(), 2u);
  EXPECT_TRUE((*v)[0].parses);
  EXPECT_FALSE((*v)[0].passed);
  EXPECT_CONTAINS((*v)[0].detail, "timed out after 1.0 s");
  EXPECT_TRUE((*v)[1].passed) << "the next program runs: " << (*v)[1].detail;
  EXPECT_LT(seconds, 30) << "the loop was not stopped at its timeout";
}

TEST(RunCodePrograms, AMemoryBombFailsUnderTheAddressSpaceLimit) {
  SKIP_WITHOUT_PYTHON3();
  SandboxLimits limits;
  limits.timeout_s = 10;
  limits.memory_mb = 256;
  auto v = run_code_programs({{"bomb", "def f():\n    return bytearray(4 * 1024 ** 3)\n", "f()\n"},
                              {"grow", "x = []\n", "while True:\n    x.append(' ' * (1 << 20))\n"}},
                             "python3", limits);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_EQ(v->size(), 2u);
  for (const CodeVerdict& c : *v) {
    EXPECT_TRUE(c.parses);
    EXPECT_FALSE(c.passed);
    EXPECT_CONTAINS(c.detail, "MemoryError");
  }
}

TEST(RunCodePrograms, ABigFileIsRefused) {
  SKIP_WITHOUT_PYTHON3();
  SandboxLimits limits;
  limits.timeout_s = 10;
  // 8 MiB against the 1 MiB file size limit.
  auto v = run_code_programs(
      {{"big", "def f():\n    with open('big.bin', 'wb') as out:\n        out.write(b'x' * (8 << 20))\n", "f()\n"},
       {"small", "def f():\n    with open('s.txt', 'w') as out:\n        out.write('ok')\n    return open('s.txt').read()\n",
        "assert f() == 'ok'\n"}},
      "python3", limits);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_EQ(v->size(), 2u);
  EXPECT_TRUE((*v)[0].parses);
  EXPECT_FALSE((*v)[0].passed) << "an 8 MiB file was written";
  std::printf("  big file: %s\n", (*v)[0].detail.c_str());
  EXPECT_TRUE((*v)[1].passed) << "a small file in its own directory is fine: " << (*v)[1].detail;
}

TEST(RunCodePrograms, ProgramsRunInAnEmptyDirectoryAndEnvironment) {
  SKIP_WITHOUT_PYTHON3();
  setenv("TESSERA_CANARY_SECRET", "leaked", 1);
  SandboxLimits limits;
  limits.timeout_s = 10;
  auto v = run_code_programs(
      {{"env", "import os\n", "assert 'TESSERA_CANARY_SECRET' not in os.environ, dict(os.environ)\n"},
       {"cwd", "import os\n", "assert os.listdir('.') == [], os.listdir('.')\n"},
       {"cwd-differs", "import os\n", "open('mine', 'w').close()\n"},
       {"cwd-again", "import os\n", "assert not os.path.exists('mine')\n"}},
      "python3", limits);
  unsetenv("TESSERA_CANARY_SECRET");
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_EQ(v->size(), 4u);
  for (const CodeVerdict& c : *v) EXPECT_TRUE(c.passed) << c.detail;
}

TEST(RunCodePrograms, SourceThatParsesIsNeverRunByTheParser) {
  SKIP_WITHOUT_PYTHON3();
  // A syntax error after a side effect: the parse fails, so nothing runs at all.
  SandboxLimits limits;
  limits.timeout_s = 10;
  auto v = run_code_programs({{"p", "import sys\nsys.exit(0)\ndef (:\n", ""}}, "python3", limits);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_EQ(v->size(), 1u);
  EXPECT_FALSE((*v)[0].parses);
  EXPECT_FALSE((*v)[0].passed);
}


// A program that forks: nothing it started may outlive the run (canary.h: its process group
// is killed when it ends). The grandchild closes its output (so the run does not wait for it) and sleeps.
TEST(RunCodePrograms, NoProcessOutlivesTheRun) {
  SKIP_WITHOUT_PYTHON3();
  SandboxLimits limits;
  limits.timeout_s = 5;
  auto v = run_code_programs(
      {{"fork", "import os, sys, time\n",
        "pid = os.fork()\nif pid == 0:\n    os.close(1)\n    os.close(2)\n    time.sleep(120)\n    os._exit(0)\n"
        "sys.exit('grandchild %d' % pid)\n"}},
      "python3", limits);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_EQ(v->size(), 1u);
  const std::string& detail = (*v)[0].detail;
  ASSERT_EQ(detail.rfind("grandchild ", 0), 0u) << detail;
  const int pid = std::stoi(detail.substr(11));
  // The kill is asynchronous: give it a moment (a killed, unreaped process is a zombie, which
  // process_alive counts as gone).
  bool alive = process_alive(pid);
  for (int i = 0; i < 100 && alive; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    alive = process_alive(pid);
  }
  if (alive) kill(pid, SIGKILL);  // do not leave it behind ourselves
  EXPECT_FALSE(alive) << "the program's child " << pid << " still runs after run_code_programs returned";
}

}  // namespace
}  // namespace tessera
