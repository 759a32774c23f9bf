// The serving load generator (loadgen/load_generator.h) and its HTTP client against a small fake
// OpenAI-compatible server built on the server's HttpServer: exact request counts,
// streamed token counts, failures, percentiles and goodput on known latencies, trace and
// distribution parsing; the client's framing, deadline and error paths against scripted raw
// TCP servers. Nothing asserts on timing beyond lower bounds that sleeps or deadlines
// guarantee (and one generous upper bound: a deadline must end a stalled request).
#include "loadgen/load_generator.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>

#include "loadgen/http_client.h"
#include "loadgen/serve_bench.h"
#include "common/logging.h"
#include "server/http_server.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

// ---- Fake server ------------------------------------------------------------------------------

struct FakeServerConfig {
  std::chrono::milliseconds first_token_delay{5};
  std::chrono::milliseconds token_gap{1};
  int reject_every = 0;        // every n-th completion request gets 429 (0: none)
  bool send_usage = true;
  int32_t vocab_size = 300;
};

// Serves /v1/models, /tokenizer_info, /metrics and /v1/completions (streaming or not) with
// `max_tokens` one-character tokens. Each completion streams from its own thread.
class FakeServer {
 public:
  explicit FakeServer(FakeServerConfig config = {}) : config_(config) {
    HttpServerOptions o;
    auto s = HttpServer::start(o, [this](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
      handle(req, std::move(r));
    });
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    server_ = std::move(*s);
  }
  ~FakeServer() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
    server_->stop();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

  std::atomic<int> completions{0};      // completion requests received
  std::atomic<int> metrics_scrapes{0};
  std::atomic<int> active{0};
  std::atomic<int> max_active{0};
  std::atomic<int> bad_requests{0};     // bodies that were not what the generator should send
  std::mutex seen_mu;
  std::vector<int64_t> seen_prompt_lengths;
  std::vector<int64_t> seen_max_tokens;

 private:
  void handle(const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    if (req.path == "/v1/models") {
      r->respond(200, "application/json", R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})");
    } else if (req.path == "/tokenizer_info") {
      r->respond(200, "application/json", Json{{"vocab_size", config_.vocab_size}}.dump());
    } else if (req.path == "/metrics") {
      metrics_scrapes.fetch_add(1);
      r->respond(200, "text/plain",
                 "# HELP tessera_batch_size x\n# TYPE tessera_batch_size gauge\ntessera_batch_size " +
                     std::to_string(active.load()) + "\ntessera_kv_usage 0.25\ntessera_waiting 0\n");
    } else if (req.path == "/v1/completions") {
      completion(req, std::move(r));
    } else {
      r->respond_error(404, "no route");
    }
  }

  void completion(const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    const int n = completions.fetch_add(1) + 1;
    Json body;
    try {
      body = Json::parse(req.body);
    } catch (const Json::exception&) {
      bad_requests.fetch_add(1);
      r->respond_error(400, "bad json");
      return;
    }
    if (config_.reject_every > 0 && n % config_.reject_every == 0) {
      r->respond_error(429, "queue full", {{"Retry-After", "1"}});
      return;
    }
    const bool ok_shape = body.value("model", "") == "fake-model" && body["prompt"].is_array() &&
                          body.value("ignore_eos", false) && body["max_tokens"].is_number_integer();
    if (!ok_shape) bad_requests.fetch_add(1);
    for (const Json& id : body["prompt"])
      if (!id.is_number_integer() || id.get<int>() < 10 || id.get<int>() >= config_.vocab_size) bad_requests.fetch_add(1);
    const int64_t max_tokens = body.value("max_tokens", 1);
    {
      std::lock_guard<std::mutex> lock(seen_mu);
      seen_prompt_lengths.push_back(static_cast<int64_t>(body["prompt"].size()));
      seen_max_tokens.push_back(max_tokens);
    }
    const bool stream = body.value("stream", false);
    std::lock_guard<std::mutex> lock(mu_);
    threads_.emplace_back([this, r, stream, max_tokens] {
      const int now_active = active.fetch_add(1) + 1;
      int prev = max_active.load();
      while (now_active > prev && !max_active.compare_exchange_weak(prev, now_active)) {
      }
      std::this_thread::sleep_for(config_.first_token_delay);
      if (!stream) {
        std::this_thread::sleep_for(config_.token_gap * (max_tokens - 1));
        active.fetch_sub(1);
        r->respond(200, "application/json",
                   Json{{"choices", {{{"text", std::string(static_cast<size_t>(max_tokens), 'x')}}}},
                        {"usage", {{"completion_tokens", max_tokens}}}}
                       .dump());
        return;
      }
      auto s = r->start_stream(200);
      for (int64_t i = 0; i < max_tokens; ++i) {
        if (i > 0) std::this_thread::sleep_for(config_.token_gap);
        const bool last = i + 1 == max_tokens;
        Json chunk = {{"object", "text_completion"},
                      {"choices", {{{"index", 0}, {"text", "x"}, {"finish_reason", last ? Json("length") : Json()}}}}};
        s->write("data: " + chunk.dump() + "\n\n");
      }
      if (config_.send_usage)
        s->write("data: " + Json{{"choices", Json::array()}, {"usage", {{"completion_tokens", max_tokens}}}}.dump() +
                 "\n\n");
      active.fetch_sub(1);
      s->write("data: [DONE]\n\n");
      s->close();
    });
  }

  FakeServerConfig config_;
  std::unique_ptr<HttpServer> server_;
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

LoadOptions base_options(const FakeServer& server) {
  LoadOptions o;
  o.url = server.url();
  o.prompt_tokens = LengthDistribution{LengthDistribution::Kind::kFixed, 16};
  o.output_tokens = LengthDistribution{LengthDistribution::Kind::kFixed, 8};
  o.metrics_interval_ms = 20;
  o.request_timeout_s = 30;
  return o;
}

// ---- End to end against the fake server -------------------------------------------------------

TEST(LoadGenerator, ClosedLoopSendsExactlyNumRequests) {
  FakeServer server;
  LoadOptions o = base_options(server);
  o.mode = ArrivalMode::kConcurrency;
  o.concurrency = 4;
  o.num_requests = 23;
  auto r = run_load(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(server.completions.load(), 23);
  EXPECT_EQ(server.bad_requests.load(), 0);
  EXPECT_LE(server.max_active.load(), 4);
  EXPECT_EQ(r->summary.sent, 23);
  EXPECT_EQ(r->summary.completed, 23);
  EXPECT_EQ(r->summary.failed, 0);
  EXPECT_EQ(r->summary.output_tokens, 23 * 8);
  EXPECT_EQ(r->summary.prompt_tokens, 23 * 16);
  ASSERT_EQ(r->requests.size(), 23u);
  for (size_t i = 0; i < r->requests.size(); ++i) {
    const RequestRecord& q = r->requests[i];
    EXPECT_EQ(q.index, static_cast<int64_t>(i));
    EXPECT_TRUE(q.ok) << q.error;
    EXPECT_EQ(q.output_tokens, 8);
    EXPECT_EQ(q.chunks, 8);
    EXPECT_EQ(q.itl_s.size(), 7u);
    EXPECT_GE(q.ttft_s, 0.005);  // the server waits 5 ms before the first token
    EXPECT_GE(q.e2e_s, q.ttft_s);
  }
  EXPECT_EQ(r->summary.itl.count, 23 * 7);
  EXPECT_EQ(r->token_id_max, 300);  // from /tokenizer_info
  EXPECT_FALSE(r->timeline.empty());
  EXPECT_GE(server.metrics_scrapes.load(), 1);
  EXPECT_EQ(r->timeline.front().values.count("batch_size"), 1u);
  EXPECT_DOUBLE_EQ(r->timeline.front().values.at("kv_usage"), 0.25);
}

TEST(LoadGenerator, OpenLoopFixedRateAndPoissonSendExactCounts) {
  FakeServer server;
  LoadOptions o = base_options(server);
  o.mode = ArrivalMode::kFixedRate;
  o.rate = 400;
  o.num_requests = 12;
  auto r = run_load(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->summary.completed, 12);
  o.mode = ArrivalMode::kPoisson;
  o.num_requests = 9;
  auto p = run_load(o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->summary.completed, 9);
  EXPECT_EQ(server.completions.load(), 21);
  EXPECT_EQ(server.bad_requests.load(), 0);
}

TEST(LoadGenerator, LengthsReachTheServerExactly) {
  FakeServer server;
  LoadOptions o = base_options(server);
  o.concurrency = 3;
  o.num_requests = 10;
  o.prompt_tokens = LengthDistribution{LengthDistribution::Kind::kUniform, 4, 40};
  o.output_tokens = LengthDistribution{LengthDistribution::Kind::kUniform, 2, 6};
  auto r = run_load(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  Workload w(o);
  int64_t want_prompt = 0, want_out = 0;
  for (int i = 0; i < 10; ++i) {
    want_prompt += w.request(i).prompt_tokens;
    want_out += w.request(i).output_tokens;
    EXPECT_EQ(r->requests[static_cast<size_t>(i)].output_tokens, w.request(i).output_tokens);
  }
  EXPECT_EQ(r->summary.prompt_tokens, want_prompt);
  EXPECT_EQ(r->summary.output_tokens, want_out);
  int64_t seen_prompt = 0, seen_out = 0;
  for (int64_t v : server.seen_prompt_lengths) seen_prompt += v;
  for (int64_t v : server.seen_max_tokens) seen_out += v;
  EXPECT_EQ(seen_prompt, want_prompt);
  EXPECT_EQ(seen_out, want_out);
}

TEST(LoadGenerator, RejectedRequestsCountAsFailures) {
  FakeServerConfig c;
  c.reject_every = 4;
  FakeServer server(c);
  LoadOptions o = base_options(server);
  o.concurrency = 2;
  o.num_requests = 20;
  auto r = run_load(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->summary.sent, 20);
  EXPECT_EQ(r->summary.failed, 5);
  EXPECT_EQ(r->summary.completed, 15);
  ASSERT_FALSE(r->summary.errors.empty());
  EXPECT_NE(r->summary.errors[0].find("HTTP 429"), std::string::npos) << r->summary.errors[0];
}

TEST(LoadGenerator, NonStreamingAndNoUsageChunk) {
  FakeServerConfig c;
  c.send_usage = false;
  FakeServer server(c);
  LoadOptions o = base_options(server);
  o.num_requests = 3;
  auto r = run_load(o);  // streaming without a usage chunk: tokens = chunks
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->summary.output_tokens, 24);
  o.stream = false;
  auto n = run_load(o);
  ASSERT_TRUE(n.is_ok());
  EXPECT_EQ(n->summary.completed, 3);
  EXPECT_EQ(n->summary.output_tokens, 24);
  EXPECT_EQ(n->summary.itl.count, 0);
  for (const RequestRecord& q : n->requests) EXPECT_DOUBLE_EQ(q.ttft_s, q.e2e_s);
}

TEST(LoadGenerator, DurationBoundStopsIssuing) {
  FakeServer server;
  LoadOptions o = base_options(server);
  o.concurrency = 2;
  o.num_requests = 0;
  o.duration_s = 0.2;
  auto r = run_load(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_GE(r->summary.sent, 1);
  EXPECT_EQ(r->summary.sent, r->summary.completed);
  EXPECT_EQ(server.completions.load(), r->summary.sent);
}

TEST(LoadGenerator, TraceArrivalsReplayEveryLine) {
  FakeServer server;
  LoadOptions o = base_options(server);
  auto t = parse_trace(
      "{\"prompt_tokens\": 5, \"output_tokens\": 3, \"arrival_s\": 0}\n"
      "{\"prompt_tokens\": 7, \"output_tokens\": 2, \"arrival_s\": 0.01}\n"
      "{\"prompt_tokens\": 9, \"output_tokens\": 4, \"arrival_s\": 0.02}\n",
      "inline");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  o.trace = *t;
  o.mode = ArrivalMode::kTrace;
  o.num_requests = 0;
  auto r = run_load(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->summary.completed, 3);
  EXPECT_EQ(r->summary.prompt_tokens, 21);
  EXPECT_EQ(r->summary.output_tokens, 9);
}

TEST(LoadGenerator, UnreachableServerFailsTheRun) {
  LoadOptions o;
  o.url = "http://127.0.0.1:1";  // nothing listens on port 1
  o.num_requests = 1;
  auto r = run_load(o);
  EXPECT_FALSE(r.is_ok());
}

// ---- Statistics on known latencies -------------------------------------------------------------

TEST(LoadStats, PercentilesInterpolateBetweenRanks) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // 1..100, unsorted
  EXPECT_DOUBLE_EQ(percentile(v, 50), 50.5);
  EXPECT_NEAR(percentile(v, 90), 90.1, 1e-9);
  EXPECT_NEAR(percentile(v, 99), 99.01, 1e-9);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 100);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
  const LatencyStats s = latency_stats({0.3, 0.1, 0.2});
  EXPECT_EQ(s.count, 3);
  EXPECT_DOUBLE_EQ(s.p50, 0.2);
  EXPECT_NEAR(s.mean, 0.2, 1e-12);
  EXPECT_DOUBLE_EQ(s.min, 0.1);
  EXPECT_DOUBLE_EQ(s.max, 0.3);
}

TEST(LoadStats, SummaryAndGoodputArithmetic) {
  // 10 requests: TTFT 10, 20, ..., 100 ms; 5 output tokens with gaps of 10 ms (TPOT 10 ms),
  // except request 9 whose gaps are 60 ms; request 4 failed.
  std::vector<RequestRecord> recs;
  for (int i = 0; i < 10; ++i) {
    RequestRecord r;
    r.index = i;
    r.ok = i != 4;
    r.prompt_tokens = 100;
    r.output_tokens = 5;
    r.ttft_s = 0.01 * (i + 1);
    const double gap = i == 9 ? 0.06 : 0.01;
    r.itl_s = {gap, gap, gap, gap};
    r.e2e_s = r.ttft_s + 4 * gap;
    if (!r.ok) r.error = "HTTP 500: boom";
    recs.push_back(r);
  }
  SloSpec slo;
  slo.ttft_s = 0.075;  // requests 0..6 (minus the failed 4) pass: 6
  slo.itl_s = 0.05;    // excludes request 9 (already out by TTFT)
  const RunSummary s = summarize_run(recs, 2.0, slo);
  EXPECT_EQ(s.sent, 10);
  EXPECT_EQ(s.completed, 9);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.good, 6);
  EXPECT_DOUBLE_EQ(s.goodput, 3.0);
  EXPECT_DOUBLE_EQ(s.request_throughput, 4.5);
  EXPECT_DOUBLE_EQ(s.output_token_throughput, 45 / 2.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 945 / 2.0);
  // TTFT over the 9 completed: 10,20,30,40,60,70,80,90,100 ms.
  EXPECT_NEAR(s.ttft.p50, 0.06, 1e-12);
  EXPECT_NEAR(s.ttft.p90, 0.09 + 0.2 * 0.01, 1e-12);  // rank 0.9 * 8 = 7.2
  EXPECT_EQ(s.itl.count, 36);
  EXPECT_NEAR(s.itl.p50, 0.01, 1e-12);
  EXPECT_NEAR(s.itl.max, 0.06, 1e-12);
  EXPECT_EQ(s.tpot.count, 9);
  ASSERT_EQ(s.errors.size(), 1u);
  EXPECT_EQ(s.errors[0], "HTTP 500: boom");
  // No SLO: every completed request counts.
  EXPECT_EQ(summarize_run(recs, 2.0, SloSpec{}).good, 9);
  // Only an ITL bound: request 9 misses it.
  SloSpec itl_only;
  itl_only.itl_s = 0.05;
  EXPECT_EQ(summarize_run(recs, 1.0, itl_only).good, 8);
}

// ---- Parsing -----------------------------------------------------------------------------------

TEST(LoadParse, LengthDistributions) {
  auto f = LengthDistribution::parse("128");
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->kind, LengthDistribution::Kind::kFixed);
  EXPECT_DOUBLE_EQ(f->mean(), 128);
  auto u = LengthDistribution::parse("uniform:10,20");
  ASSERT_TRUE(u.is_ok());
  EXPECT_DOUBLE_EQ(u->mean(), 15);
  auto l = LengthDistribution::parse("lognormal:100,0.5");
  ASSERT_TRUE(l.is_ok());
  EXPECT_TRUE(LengthDistribution::parse("fixed:64").is_ok());
  for (const char* bad : {"", "abc", "uniform:20,10", "uniform:5", "lognormal:100", "gauss:1,2", "fixed:0", "-3"})
    EXPECT_FALSE(LengthDistribution::parse(bad).is_ok()) << bad;
}

TEST(LoadParse, SampledMeansMatchTheDistributions) {
  std::mt19937_64 rng(42);
  auto mean_of = [&](const LengthDistribution& d) {
    double sum = 0;
    constexpr int kN = 40000;
    for (int i = 0; i < kN; ++i) {
      const int64_t x = d.sample(rng);
      EXPECT_GE(x, d.min_tokens);
      sum += static_cast<double>(x);
    }
    return sum / kN;
  };
  EXPECT_DOUBLE_EQ(mean_of(*LengthDistribution::parse("77")), 77);
  EXPECT_NEAR(mean_of(*LengthDistribution::parse("uniform:10,20")), 15, 0.1);
  EXPECT_NEAR(mean_of(*LengthDistribution::parse("lognormal:200,0.5")), 200, 200 * 0.02);
  EXPECT_NEAR(mean_of(*LengthDistribution::parse("lognormal:64,1.0")), 64, 64 * 0.05);
}

TEST(LoadParse, Traces) {
  auto t = parse_trace(
      "{\"prompt_tokens\": 12, \"output_tokens\": 3}\n\n"
      "  {\"prompt_tokens\": 1, \"output_tokens\": 1, \"arrival_s\": 1.5, \"extra\": true}  \n",
      "t.jsonl");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].prompt_tokens, 12);
  EXPECT_FALSE((*t)[0].arrival_s.has_value());
  EXPECT_DOUBLE_EQ(*(*t)[1].arrival_s, 1.5);
  auto bad = parse_trace("{\"prompt_tokens\": 12, \"output_tokens\": 3}\n{\"prompt_tokens\": 0, \"output_tokens\": 3}",
                         "t.jsonl");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("t.jsonl:2"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(parse_trace("{not json", "x").is_ok());
  EXPECT_FALSE(parse_trace("\n\n", "x").is_ok());
  EXPECT_FALSE(parse_trace("{\"prompt_tokens\": 3, \"output_tokens\": 3, \"arrival_s\": -1}", "x").is_ok());
  EXPECT_FALSE(load_trace("/nonexistent/trace.jsonl").is_ok());
}

TEST(LoadParse, Slo) {
  auto s = SloSpec::parse("ttft=200ms,itl=50ms");
  ASSERT_TRUE(s.is_ok());
  EXPECT_DOUBLE_EQ(*s->ttft_s, 0.2);
  EXPECT_DOUBLE_EQ(*s->itl_s, 0.05);
  EXPECT_FALSE(s->e2e_s.has_value());
  auto e = SloSpec::parse("e2e=2s,tpot=500us,ttft=30");
  ASSERT_TRUE(e.is_ok());
  EXPECT_DOUBLE_EQ(*e->e2e_s, 2.0);
  EXPECT_DOUBLE_EQ(*e->itl_s, 0.0005);
  EXPECT_DOUBLE_EQ(*e->ttft_s, 0.03);
  EXPECT_TRUE(SloSpec::parse("").is_ok());
  for (const char* bad : {"ttft", "ttft=abc", "latency=1ms", "ttft=-1ms"}) EXPECT_FALSE(SloSpec::parse(bad).is_ok()) << bad;
}

TEST(LoadParse, SloOnTheGapsOfEachRequest) {
  // A stream of 20 gaps of 10 ms and one stall of 400 ms: a mean of 28 ms, a P99 gap of 400 ms.
  RequestRecord r;
  r.ok = true;
  r.ttft_s = 0.1;
  r.output_tokens = 22;
  r.itl_s.assign(20, 0.010);
  r.itl_s.push_back(0.400);
  r.e2e_s = r.ttft_s + 0.6;
  auto mean = SloSpec::parse("ttft=200ms,itl=50ms");
  ASSERT_TRUE(mean.is_ok());
  EXPECT_FALSE(mean->itl_per_gap);
  EXPECT_TRUE(meets_slo(r, *mean));
  auto gap = SloSpec::parse("ttft=200ms,itl_p99=50ms");
  ASSERT_TRUE(gap.is_ok());
  EXPECT_TRUE(gap->itl_per_gap);
  EXPECT_EQ(gap->to_string(), "ttft=200ms,itl_p99=50ms");
  EXPECT_FALSE(meets_slo(r, *gap));
  r.itl_s.back() = 0.045;  // no stall
  EXPECT_TRUE(meets_slo(r, *gap));
}

TEST(LoadParse, ServerGauges) {
  const auto g = parse_server_gauges(
      "# HELP tessera_batch_size Sequences in the last step\n"
      "# TYPE tessera_batch_size gauge\n"
      "tessera_batch_size 12\n"
      "tessera_kv_usage 0.5\n"
      "tessera_kv_blocks{state=\"used\"} 40\n"
      "tessera_waiting 3 1700000000\n"
      "vllm:num_requests_running{model_name=\"a b\"} 2\n"
      "vllm:num_requests_running{model_name=\"c\"} 1\n");
  EXPECT_DOUBLE_EQ(g.at("batch_size"), 12);
  EXPECT_DOUBLE_EQ(g.at("kv_usage"), 0.5);
  EXPECT_DOUBLE_EQ(g.at("waiting"), 3);
  EXPECT_DOUBLE_EQ(g.at("running"), 3);
  EXPECT_EQ(g.size(), 4u);
}

TEST(LoadParse, WorkloadIsDeterministicPerIndex) {
  LoadOptions o;
  o.seed = 9;
  o.prompt_tokens = *LengthDistribution::parse("uniform:1,1000");
  o.output_tokens = *LengthDistribution::parse("lognormal:50,1");
  Workload a(o), b(o);
  const PlannedRequest r7 = a.request(7);
  for (int i = 0; i < 7; ++i) (void)b.request(i);
  EXPECT_EQ(b.request(7).prompt_tokens, r7.prompt_tokens);
  EXPECT_EQ(b.request(7).output_tokens, r7.output_tokens);
  const auto ids = a.prompt_ids(r7, 10, 20);
  EXPECT_EQ(static_cast<int64_t>(ids.size()), r7.prompt_tokens);
  for (int32_t id : ids) {
    EXPECT_GE(id, 10);
    EXPECT_LT(id, 20);
  }
  EXPECT_EQ(ids, b.prompt_ids(r7, 10, 20));
}

TEST(LoadParse, Options) {
  LoadOptions o;
  EXPECT_TRUE(validate_load_options(o).is_ok());
  o.num_requests = 0;
  EXPECT_FALSE(validate_load_options(o).is_ok());  // no bound at all
  o.duration_s = 1;
  EXPECT_TRUE(validate_load_options(o).is_ok());
  o.mode = ArrivalMode::kPoisson;
  o.rate = 0;
  EXPECT_FALSE(validate_load_options(o).is_ok());
  o.mode = ArrivalMode::kTrace;
  o.trace = {TraceEntry{1, 1, std::nullopt}};
  EXPECT_FALSE(validate_load_options(o).is_ok());  // trace arrivals need arrival_s
}

// ---- HTTP client and SSE -----------------------------------------------------------------------

TEST(HttpClientTest, ParsesUrls) {
  auto u = parse_http_url("http://localhost:8000/v1/");
  ASSERT_TRUE(u.is_ok());
  EXPECT_EQ(u->host, "localhost");
  EXPECT_EQ(u->port, 8000);
  EXPECT_EQ(u->path_prefix, "/v1");
  auto v = parse_http_url("127.0.0.1");
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(v->port, 80);
  auto w = parse_http_url("http://[::1]:9");
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ(w->host, "::1");
  for (const char* bad : {"https://x", "ftp://x", "http://:80", "http://x:0", "http://x:abc"})
    EXPECT_FALSE(parse_http_url(bad).is_ok()) << bad;
}

TEST(HttpClientTest, SseEventsSurviveArbitrarySplits) {
  const std::string stream =
      ": comment\r\ndata: {\"a\":1}\r\n\r\ndata: line1\ndata: line2\n\nevent: x\ndata:[DONE]\n\n";
  for (size_t step = 1; step <= stream.size(); ++step) {
    SseParser p;
    std::vector<std::string> events;
    for (size_t i = 0; i < stream.size(); i += step)
      p.feed(std::string_view(stream).substr(i, step), [&](std::string_view d) {
        events.emplace_back(d);
        return true;
      });
    ASSERT_EQ(events.size(), 3u) << "step " << step;
    EXPECT_EQ(events[0], "{\"a\":1}");
    EXPECT_EQ(events[1], "line1\nline2");
    EXPECT_EQ(events[2], "[DONE]");
  }
}

TEST(HttpClientTest, KeepAliveAndChunkedBodies) {
  FakeServer server;
  auto url = parse_http_url(server.url());
  ASSERT_TRUE(url.is_ok());
  HttpClient c(*url);
  for (int i = 0; i < 3; ++i) {
    auto r = c.get("/v1/models", 5s);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("fake-model"), std::string::npos);
    EXPECT_TRUE(c.connected());
  }
  auto nf = c.get("/nope", 5s);
  ASSERT_TRUE(nf.is_ok());
  EXPECT_EQ(nf->status, 404);
  std::string streamed;
  auto s = c.request("POST", "/v1/completions",
                     R"({"model":"fake-model","prompt":[11,12],"max_tokens":3,"ignore_eos":true,"stream":true})",
                     std::chrono::steady_clock::now() + 5s, [&](std::string_view piece) {
                       streamed.append(piece);
                       return true;
                     });
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->status, 200);
  EXPECT_EQ(s->header("transfer-encoding"), "chunked");
  EXPECT_TRUE(s->body.empty());
  EXPECT_NE(streamed.find("data: [DONE]\n\n"), std::string::npos);
  auto again = c.get("/tokenizer_info", 5s);  // the connection is still usable after a stream
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->status, 200);
}

// A TCP server on an ephemeral port that answers each accepted connection with a script: the
// script gets the socket once the request head has been read. For the client's framing,
// deadline and error paths, which a well-behaved server never takes.
class RawServer {
 public:
  using Script = std::function<void(int fd)>;
  explicit RawServer(std::vector<Script> scripts) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, scripts = std::move(scripts)] {
      for (const Script& script : scripts) {
        const int fd = ::accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) return;
        std::string head;
        char c;
        while (head.find("\r\n\r\n") == std::string::npos && ::recv(fd, &c, 1, 0) == 1) head += c;
        script(fd);
        ::close(fd);
      }
    });
  }
  ~RawServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
  }
  HttpUrl url() const { return HttpUrl{"127.0.0.1", port_, ""}; }

  static void send_text(int fd, std::string_view s) { ::send(fd, s.data(), s.size(), MSG_NOSIGNAL); }
  // Waits for `flag` (set by the client's callback) for at most 10 s; false on time-out.
  static bool wait_for(const std::atomic<bool>& flag) {
    for (int i = 0; i < 10000 && !flag.load(); ++i) std::this_thread::sleep_for(1ms);
    return flag.load();
  }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// The second piece is only sent once the client has handed the first to its callback, so a
// client that held bodies back until their end would stall here (and the server would notice).
TEST(HttpClientTest, BodyPiecesReachTheCallbackAsTheyArrive) {
  const std::vector<std::pair<std::string, std::pair<std::string, std::string>>> framings = {
      {"Transfer-Encoding: chunked", {"5\r\nfirst\r\n", "6\r\nsecond\r\n0\r\n\r\n"}},
      {"Content-Length: 11", {"first", "second"}},
      {"Connection: close", {"first", "second"}},
  };
  for (const auto& [header, pieces] : framings) {
    std::atomic<bool> got_first{false}, server_saw_first{false};
    RawServer server({[&, header = header, pieces = pieces](int fd) {
      RawServer::send_text(fd, "HTTP/1.1 200 OK\r\n" + header + "\r\n\r\n" + pieces.first);
      server_saw_first = RawServer::wait_for(got_first);
      RawServer::send_text(fd, pieces.second);
    }});
    HttpClient c(server.url());
    std::string body;
    auto r = c.request("GET", "/", "", std::chrono::steady_clock::now() + 30s, [&](std::string_view piece) {
      body.append(piece);
      if (body.size() >= 5) got_first = true;
      return true;
    });
    ASSERT_TRUE(r.is_ok()) << header << ": " << r.status().to_string();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(body, "firstsecond") << header;
    EXPECT_TRUE(server_saw_first.load()) << header;
  }
}

TEST(HttpClientTest, DeadlineAndSilenceEndAStalledStream) {
  for (const bool by_deadline : {true, false}) {
    std::atomic<bool> client_done{false};
    RawServer server({[&](int fd) {
      RawServer::send_text(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n");
      RawServer::wait_for(client_done);  // then silence
    }});
    HttpClientOptions o;
    o.read_timeout = by_deadline ? 60s : 200ms;
    HttpClient c(server.url(), o);
    std::string body;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.request("GET", "/", "", t0 + (by_deadline ? 200ms : 60s), [&](std::string_view piece) {
      body.append(piece);
      return true;
    });
    const auto waited = std::chrono::steady_clock::now() - t0;
    client_done = true;
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().to_string();
    EXPECT_EQ(body, "first");
    EXPECT_GE(waited, 199ms);  // poll() waits whole milliseconds
    EXPECT_LT(waited, 10s);
    EXPECT_FALSE(c.connected());
  }
}

TEST(HttpClientTest, ServerGoneMidBodyIsUnavailableAndStopCloses) {
  RawServer server({
      [](int fd) { RawServer::send_text(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b"); },
      [](int fd) { RawServer::send_text(fd, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"); },
  });
  HttpClient c(server.url());
  auto r = c.get("/", 10s);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().to_string();
  // A callback that says stop: the request is answered and the connection closed.
  auto s = c.request("GET", "/", "", std::chrono::steady_clock::now() + 10s, [](std::string_view) { return false; });
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->status, 200);
  EXPECT_FALSE(c.connected());
}

TEST(HttpClientTest, ReconnectsWhenTheServerClosedAKeptAliveConnection) {
  RawServer server({
      [](int fd) { RawServer::send_text(fd, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none"); },  // then closes
      [](int fd) { RawServer::send_text(fd, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo"); },
  });
  HttpClient c(server.url());
  auto a = c.get("/", 10s);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->body, "one");
  // Whether the close has arrived yet (seen before reuse) or not (the request fails unanswered
  // and is retried once), the second request goes out on a new connection.
  auto b = c.get("/", 10s);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->body, "two");
}

// ---- Reports -----------------------------------------------------------------------------------

TEST(ServeReport, TableHasOneRowPerLevel) {
  std::vector<ServeLevel> levels(3);
  for (size_t i = 0; i < levels.size(); ++i) {
    levels[i].mode = "concurrency";
    levels[i].load = static_cast<double>(1 << (3 * i));
  }
  const std::string t = format_serve_table(levels, false);
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 5);  // header, 3 rows, the note
  EXPECT_NE(t.find("64 clients"), std::string::npos);
  const std::string md = format_serve_table(levels, true);
  EXPECT_EQ(std::count(md.begin(), md.end(), '\n'), 5);  // header, separator, 3 rows
}

}  // namespace
}  // namespace tessera
