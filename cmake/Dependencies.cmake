# Third-party dependencies, all from Debian packages (see scripts/install_deps.sh).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(GTest REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# Unicode normalization for the tokenizers (NFC). No version floor: Debian 12's utf8proc 2.8.0
# ships a libutf8proc.pc that says 2.6.0.
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
# The benchmarks' HTTP client (loadgen/http_client.cpp). Debian builds the library in split mode
# (declarations in httplib.h, code in libcpp-httplib.so) with OpenSSL, zlib and Brotli; the .pc
# file's Cflags carry the matching CPPHTTPLIB_*_SUPPORT defines, which must agree with the .so.
pkg_check_modules(CPP_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
find_package(CLI11 CONFIG REQUIRED)
