// `tessera bench serve`: load generator for any OpenAI-compatible endpoint (loadgen/serve_bench.h).
// `tessera bench scale`: the engine at several TP degrees on one workload (launch/bench_scale.h).
#include <fstream>
#include <memory>
#include <sstream>

#include "loadgen/bench_report.h"
#include "launch/bench_scale.h"
#include "loadgen/serve_bench.h"
#include "launch/commands.h"

namespace tessera::cli {
namespace {

// This process's command line, for the reports.
std::string own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string line;
  size_t pos = 0;
  while (pos < all.size()) {
    const size_t e = all.find('\0', pos);
    const std::string arg = all.substr(pos, e == std::string::npos ? std::string::npos : e - pos);
    line += (line.empty() ? "" : " ") + shell_quote(arg);
    if (e == std::string::npos) break;
    pos = e + 1;
  }
  return line;
}

struct ServeArgs {
  ServeBenchOptions bench;
  std::string prompt_spec = "128";
  std::string output_spec = "128";
  std::string trace_path;
  std::string slo;
  std::string arrivals = "poisson";
  std::string token_range;
  double rate = 0;
  int concurrency = 0;
  bool no_stream = false;
  bool no_plots = false;
  bool no_install = false;
  CLI::Option* num_requests_opt = nullptr;
};

int run_bench_serve(ServeArgs& a) {
  ServeBenchOptions& o = a.bench;
  LoadOptions& l = o.load;
  auto prompt = LengthDistribution::parse(a.prompt_spec);
  if (!prompt.is_ok()) return fail("--prompt-tokens: " + prompt.status().message());
  auto output = LengthDistribution::parse(a.output_spec);
  if (!output.is_ok()) return fail("--output-tokens: " + output.status().message());
  l.prompt_tokens = *prompt;
  l.output_tokens = *output;
  auto slo = SloSpec::parse(a.slo);
  if (!slo.is_ok()) return fail(slo.status().message());
  l.slo = *slo;
  if (!a.token_range.empty()) {
    int lo = 0, hi = 0;
    char comma = 0;
    std::istringstream in(a.token_range);
    if (!(in >> lo >> comma >> hi) || comma != ',' || lo < 0 || hi <= lo)
      return fail("--token-ids '" + a.token_range + "': expected LOW,HIGH with 0 <= LOW < HIGH");
    l.token_id_min = lo;
    l.token_id_max = hi;
  }
  l.stream = !a.no_stream;
  o.plots = !a.no_plots;
  o.install_plot_deps = !a.no_install;
  const bool explicit_count = a.num_requests_opt->count() > 0;
  if (!a.trace_path.empty()) {
    auto trace = load_trace(a.trace_path);
    if (!trace.is_ok()) return fail(trace.status().to_string());
    l.trace = std::move(*trace);
    if (!explicit_count) l.num_requests = static_cast<int64_t>(l.trace.size());
  } else if (!explicit_count && l.duration_s > 0) {
    l.num_requests = 0;  // bounded by time only
  }
  if (a.concurrency > 0 && (a.rate > 0 || !o.sweep_rate.empty()))
    return fail("--concurrency and --rate are exclusive (closed loop or open loop)");
  if (!o.sweep_concurrency.empty() && !o.sweep_rate.empty())
    return fail("--sweep-concurrency and --sweep-rate are exclusive");
  if (a.rate > 0 || !o.sweep_rate.empty()) {
    l.mode = a.arrivals == "fixed" ? ArrivalMode::kFixedRate : ArrivalMode::kPoisson;
    l.rate = a.rate;
  } else if (!l.trace.empty() && a.concurrency == 0 && o.sweep_concurrency.empty()) {
    l.mode = ArrivalMode::kTrace;
  } else {
    l.mode = ArrivalMode::kConcurrency;
    l.concurrency = a.concurrency > 0 ? a.concurrency : 1;
  }
  o.command_line = own_command_line();
  return run_serve_bench(o);
}

void add_serve(CLI::App& app, const std::shared_ptr<ServeArgs>& a) {
  ServeBenchOptions& o = a->bench;
  LoadOptions& l = o.load;
  app.add_option("--url", l.url, "server root (http://HOST:PORT)")->capture_default_str();
  app.add_option("--model", l.model, "model id for the requests (default: the first of /v1/models)");
  app.add_option("--concurrency,-c", a->concurrency, "closed loop: this many clients (default 1)");
  app.add_option("--rate,-r", a->rate, "open loop: requests per second");
  app.add_option("--arrivals", a->arrivals, "open-loop arrivals: poisson or fixed")
      ->check(CLI::IsMember({"poisson", "fixed"}))
      ->capture_default_str();
  app.add_option("--sweep-concurrency", o.sweep_concurrency, "run at each of these client counts (1,8,32,128)")
      ->delimiter(',');
  app.add_option("--sweep-rate", o.sweep_rate, "run at each of these request rates (req/s)")->delimiter(',');
  a->num_requests_opt =
      app.add_option("--num-requests,-n", l.num_requests, "requests per load level (0: bounded by --duration)")
          ->capture_default_str();
  app.add_option("--duration", l.duration_s, "seconds per load level: no new requests after it")->capture_default_str();
  app.add_option("--prompt-tokens", a->prompt_spec, "prompt length: N, uniform:LO,HI or lognormal:MEAN,SIGMA")
      ->capture_default_str();
  app.add_option("--output-tokens", a->output_spec, "output length: N, uniform:LO,HI or lognormal:MEAN,SIGMA")
      ->capture_default_str();
  app.add_option("--trace", a->trace_path,
                 "JSONL of {\"prompt_tokens\", \"output_tokens\", \"arrival_s\"}: lengths, and arrivals unless "
                 "--rate or --concurrency is given");
  app.add_option("--slo", a->slo, "goodput SLO, e.g. ttft=200ms,itl=50ms,e2e=5s (itl: the request's mean)");
  app.add_option("--seed", l.seed, "workload seed (lengths, prompt ids, arrivals)")->capture_default_str();
  app.add_option("--temperature", l.temperature, "sampling temperature of the requests")->capture_default_str();
  app.add_option("--token-ids", a->token_range, "prompt token ids LOW,HIGH (default: 10 to the server's vocab)");
  app.add_flag("--no-stream", a->no_stream, "non-streaming requests (TTFT = E2E, no ITL)");
  app.add_option("--request-timeout", l.request_timeout_s, "seconds before a request counts as failed")
      ->capture_default_str();
  app.add_option("--metrics-interval-ms", l.metrics_interval_ms, "sampling period of GET /metrics (0: off)")
      ->capture_default_str();
  app.add_option("--max-inflight", l.max_inflight, "open loop: requests in flight at most")->capture_default_str();
  app.add_option("--title", o.title, "names the run in the reports and plot legends");
  app.add_option("--json", o.json_path, "write the results (summary and /metrics timeline per level) as JSON");
  app.add_flag("--json-requests", o.json_requests, "also write every request's timings into the JSON");
  app.add_option("--plots", o.plot_prefix, "PNG prefix: <prefix>-latency.png, <prefix>-timeline.png (default: the --json path)");
  app.add_flag("--no-plots", a->no_plots, "no PNG plots");
  app.add_flag("--no-install", a->no_install, "never create .venv or pip-install matplotlib for the plots");
  app.add_option("--md", o.markdown_path, "append a markdown section (machine, command, date, table) to this file");
  app.add_flag("--progress", o.force_progress, "progress bar even when stderr is not a terminal");
  app.add_flag("--no-progress", o.no_progress, "no progress bar");
}

struct ScaleArgs {
  ScaleBenchOptions bench;
  std::string tp = "1,2";
  bool no_plots = false;
  bool no_install = false;
};

int run_bench_scale(ScaleArgs& a) {
  ScaleBenchOptions& o = a.bench;
  auto tps = parse_tp_list(a.tp);
  if (!tps.is_ok()) return fail(tps.status().message());
  o.tp_list = *tps;
  o.plots = !a.no_plots;
  o.install_plot_deps = !a.no_install;
  o.command_line = own_command_line();
  return run_scale_bench(o);
}

void add_scale(CLI::App& app, const std::shared_ptr<ScaleArgs>& a) {
  ScaleBenchOptions& o = a->bench;
  app.add_option("--tp", a->tp, "TP degrees, e.g. 1,2,4 (more ranks than cores run oversubscribed)")
      ->capture_default_str();
  app.add_option("--model", o.model, "model file or directory (default: a synthetic one, see --preset)");
  app.add_option("--preset", o.preset, "synthetic model preset when no --model (tiny, gqa4, 110m, 1.1b)")
      ->capture_default_str();
  app.add_option("--type", o.type, "synthetic model weight type (f32, q8_0, q4_k, ...)")->capture_default_str();
  app.add_option("--model-cache", o.model_cache_dir, "where synthetic models are kept (default: <tmp>/tessera-bench-models)");
  app.add_option("--batch", o.batch, "sequences per step")->capture_default_str();
  app.add_option("--prompt-tokens", o.prompt_tokens, "prompt tokens per sequence")->capture_default_str();
  app.add_option("--decode-steps", o.decode_steps, "timed decode steps")->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "untimed decode steps first")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per shard (0: the cores each shard is bound to)");
  app.add_option("--device", o.device, "shard device: cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app.add_option("--title", o.title, "names the run in the reports");
  app.add_option("--json", o.json_path, "write the results as JSON");
  app.add_option("--plots", o.plot_prefix, "PNG prefix: <prefix>-scaling.png (default: the --json path)");
  app.add_flag("--no-plots", a->no_plots, "no PNG plot");
  app.add_flag("--no-install", a->no_install, "never create .venv or pip-install matplotlib for the plot");
  app.add_option("--md", o.markdown_path, "append a markdown section (machine, command, date, table) to this file");
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  app.require_subcommand(1);
  auto serve = std::make_shared<ServeArgs>();
  auto scale = std::make_shared<ScaleArgs>();
  CLI::App* serve_app = app.add_subcommand(
      "serve", "Load-test an OpenAI-compatible server: TTFT, ITL, E2E percentiles, throughput, goodput");
  add_serve(*serve_app, serve);
  CLI::App* scale_app =
      app.add_subcommand("scale", "Run the engine at several TP degrees: throughput, step breakdown, efficiency");
  add_scale(*scale_app, scale);
  return [serve, scale, serve_app, scale_app] {
    if (serve_app->parsed()) return run_bench_serve(*serve);
    if (scale_app->parsed()) return run_bench_scale(*scale);
    return fail("bench needs a subcommand: serve or scale");
  };
}

}  // namespace tessera::cli
