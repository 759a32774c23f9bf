# Third-party dependencies, all from Debian packages (see scripts/install_deps.sh).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(GTest REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
find_package(CLI11 CONFIG REQUIRED)
