// `tessera generate`: one prompt, streamed output, through the engine (engine/engine.h):
// without --tp over a shard in this process (local/local_model.h), with --tp over shard
// processes (server/shard_group.h).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/default_model.h"
#include "cli/flags.h"
#include "common/logging.h"
#include "engine/block_pool.h"
#include "engine/engine.h"
#include "kernels/gemm.h"
#include "server/shard_group.h"
#include "server/shard_launcher.h"
#include "launch/commands.h"
#include "local/local_model.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace tessera::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  int64_t max_tokens = 64;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  bool seed_set = false;
  bool print_ids = false;
  bool ignore_eos = false;
  ShardRuntimeOptions shard;  // the in-process shard's, or (--tp) the shard processes'
  int64_t block_size = 16;
  bool kv_window_pool = true;
  int64_t prefill_chunk = 0;
  int tp = 0;                 // 0: in this process; >= 1: through a coordinator and shards
  int64_t heartbeat_timeout_ms = 2000;
  int64_t max_kv_mb = 1024;
  std::vector<std::string> hosts;
  std::vector<std::string> shard_args;
  SpeculationConfig speculation;
  std::string speculation_mode = "auto";
};

// Streams text pieces to stdout as tokens arrive.
class TextStreamer {
 public:
  explicit TextStreamer(const Tokenizer* t) {
    if (t) decoder_ = std::make_unique<IncrementalDecoder>(*t, /*skip_special=*/true);
  }
  void push(int32_t id) {
    if (!decoder_) return;
    write(decoder_->push(id));
  }
  void finish() {
    if (decoder_) write(decoder_->flush());
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

 private:
  static void write(const std::string& piece) {
    if (piece.empty()) return;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  }
  std::unique_ptr<IncrementalDecoder> decoder_;
};

// On stderr after a run with speculation: what the drafts did (class 0: generate's one request).
void print_speculation(const GenerateArgs& a, const MetricsRegistry& m) {
  if (a.speculation.mode == SpecMode::kOff) return;
  double proposed = 0, kept = 0;
  std::string gates;
  for (int p = 0; p < (a.speculation.draft_layers > 0 ? kProposals : 1); ++p) {
    const std::string_view name = proposal_name(static_cast<Proposal>(p));
    const std::string label = fmt::format("class=\"0\",proposer=\"{}\"", name);
    proposed += m.value("tessera_spec_proposed_tokens_total", label);
    kept += m.value("tessera_spec_accepted_tokens_total", label);
    gates += fmt::format("{}{} {}", gates.empty() ? "" : ", ", name,
                         m.value("tessera_spec_enabled", label) > 0 ? "on" : "off");
  }
  std::fprintf(stderr, "speculation %s: %.0f drafts proposed, %.0f kept (%.0f%%), %.0f steps, gate %s\n",
               std::string(spec_mode_name(a.speculation.mode)).c_str(), proposed, kept,
               proposed > 0 ? 100.0 * kept / proposed : 0.0, m.value("tessera_steps_total"), gates.c_str());
}

void print_ids(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ',';
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
}

SamplingParams sampling_of(const GenerateArgs& a) {
  SamplingParams s;
  s.temperature = a.temperature;
  s.top_p = a.top_p;
  s.top_k = a.top_k;
  s.min_p = a.min_p;
  s.repetition_penalty = a.repetition_penalty;
  s.seed = a.seed;
  s.has_seed = a.seed_set;
  return s;
}

// Runs the request through a coordinator (this process) and `tp` shard processes.
int run_remote(const GenerateArgs& a, const std::vector<int32_t>& prompt, const Tokenizer* tokenizer) {
  auto loaded = load_model_config(a.model);  // config only: the shards load the weights
  if (!loaded.is_ok()) return fail(loaded.status().to_string());
  const ModelConfig& config = *loaded;

  ShardGroupOptions go;
  go.world_size = a.tp;
  go.endpoint = a.hosts.empty() ? local_control_endpoint() : "tcp://0.0.0.0:0";
  go.block_size = a.block_size;
  go.kv_dtype = a.shard.kv_dtype;
  go.heartbeat_timeout = std::chrono::milliseconds(a.heartbeat_timeout_ms);
  go.max_kv_bytes = static_cast<uint64_t>(a.max_kv_mb) << 20;
  // One request needs at most its prompt plus its new tokens, within the context.
  const int64_t tokens = std::min<int64_t>(config.max_positions, static_cast<int64_t>(prompt.size()) + a.max_tokens);
  go.max_blocks = (tokens + a.block_size - 1) / a.block_size + 1;
  // One request: prompt pieces of prefill_chunk tokens (512 when 0).
  const int64_t chunk = a.prefill_chunk > 0 ? a.prefill_chunk : 512;
  go.step_tokens = chunk;
  go.step_seqs = 1;
  go.window_pool = a.kv_window_pool;
  go.draft_layers = a.speculation.draft_layers;
  go.draft_vocab = a.speculation.draft_vocab;
  if (tokenizer != nullptr && a.speculation.draft_layers > 0) go.draft_ids = tokenizer->frequent_ids(a.speculation.draft_vocab);
  auto group = ShardGroup::create(go);
  if (!group.is_ok()) return fail(group.status().to_string());

  ShardLaunchSpec spec;
  spec.shard_binary = sibling_executable("tessera-shard");
  spec.model_path = a.model;
  spec.coordinator_endpoint = (*group)->endpoint();
  spec.tp = a.tp;
  spec.runtime = a.shard;
  spec.runtime.max_step_tokens = chunk;
  spec.runtime.max_step_seqs = 1;
  spec.hosts = a.hosts;
  spec.extra_shard_args = a.shard_args;
  auto child = ChildProcess::spawn(build_shard_command(spec));
  if (!child.is_ok()) return fail(child.status().to_string());
  ChildProcess& shards = *child;
  Status started = (*group)->start([&]() -> Status {
    if (shards.running()) return Status::ok();
    return Status::unavailable(fmt::format("the shard processes exited with code {} during start-up", shards.exit_code()));
  });
  if (!started.is_ok()) {
    shards.terminate();
    return fail(started.to_string());
  }

  auto blocks = BlockPool::create({(*group)->plan().num_blocks, static_cast<int32_t>(a.block_size), true});
  if (!blocks.is_ok()) {
    shards.terminate();
    return fail(blocks.status().to_string());
  }
  MetricsRegistry metrics;
  declare_engine_metrics(metrics);
  SingleRequest r;
  r.prompt = prompt;
  r.sampling = sampling_of(a);
  r.max_tokens = a.max_tokens;
  r.ignore_eos = a.ignore_eos;
  r.prefill_chunk = chunk;
  r.speculation = a.speculation;
  r.eos_ids = config.eos_ids;
  r.max_positions = config.max_positions;
  TextStreamer streamer(tokenizer);
  std::vector<int32_t> ids;
  std::optional<BlockPool> window_blocks;
  if ((*group)->plan().num_window_blocks > 0) {
    auto w = BlockPool::create({(*group)->plan().num_window_blocks, static_cast<int32_t>(a.block_size), true});
    if (!w.is_ok()) {
      shards.terminate();
      return fail(w.status().to_string());
    }
    window_blocks = std::move(w).value();
  }
  const WindowPool window{window_blocks ? &*window_blocks : nullptr, (*group)->plan().window};
  Result<std::string> finish = run_single_request(**group, *blocks, window, metrics, r, [&](const JobEvent& ev) {
    for (int32_t id : ev.tokens) {
      ids.push_back(id);
      streamer.push(id);
    }
  });
  if (!finish.is_ok()) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
    shards.terminate();
    return fail(finish.status().message());
  }
  streamer.finish();
  (*group)->shutdown("generation finished");
  if (!shards.wait_for(std::chrono::milliseconds(5000))) shards.terminate();
  print_speculation(a, metrics);
  if (a.print_ids) print_ids(ids);
  return 0;
}

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t");
    size_t e = item.find_last_not_of(" \t");
    if (b == std::string::npos) return Status::invalid_argument("--prompt-ids: item " + std::to_string(ids.size() + 1) + " is empty");
    item = item.substr(b, e - b + 1);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < INT32_MIN || v > INT32_MAX)
      return Status::invalid_argument("--prompt-ids: '" + item + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return Status::invalid_argument("--prompt-ids: no ids given");
  return ids;
}

int run_generate(const GenerateArgs& a) {
  if (a.prompt.empty() == a.prompt_ids.empty())
    return fail("give exactly one of --prompt TEXT or --prompt-ids 1,2,3");
  if (a.max_tokens < 0) return fail("--max-tokens must be >= 0");

  // The tokenizer is needed for text prompts and for printing text; with --prompt-ids and
  // --print-ids a model without one still runs.
  std::unique_ptr<Tokenizer> tokenizer;
  auto tok = load_tokenizer_for_model(a.model);
  if (tok.is_ok()) {
    tokenizer = std::move(tok).value();
  } else if (!a.prompt.empty()) {
    return fail(tok.status().to_string());
  }

  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    std::string list = a.prompt_ids;
    if (list[0] == '@') {  // a file of them (a long prompt outgrows one argument)
      std::ifstream f(list.substr(1));
      if (!f) return fail("--prompt-ids: cannot read " + list.substr(1));
      std::stringstream ss;
      ss << f.rdbuf();
      list = ss.str();
      while (!list.empty() && (list.back() == '\n' || list.back() == ' ')) list.pop_back();
    }
    auto ids = parse_ids(list);
    if (!ids.is_ok()) return fail(ids.status().message());
    prompt = std::move(ids).value();
  } else {
    prompt = tokenizer->encode(a.prompt, /*add_special=*/true);
  }

  if (a.tp > 0) return run_remote(a, prompt, tokenizer.get());

  if (Status st = set_matmul_precision(a.shard.matmul_precision); !st.is_ok())
    return fail("--matmul-precision: " + st.to_string());
  LocalModelOptions mo;
  mo.path = a.model;
  mo.runtime = a.shard;
  mo.block_size = a.block_size;
  std::optional<ImportanceMatrix> importance;
  if (!a.shard.imatrix.empty()) {
    auto m = load_importance(a.shard.imatrix);
    if (!m.is_ok()) return fail(m.status().to_string());
    importance = std::move(m).value();
    mo.importance = &*importance;
  }
  mo.draft = SelfDraftConfig{a.speculation.draft_layers, a.speculation.draft_vocab, {}};
  if (tokenizer && a.speculation.draft_layers > 0) mo.draft.ids = tokenizer->frequent_ids(a.speculation.draft_vocab);
  auto model = LocalModel::load(mo);
  if (!model.is_ok()) return fail(model.status().to_string());

  GenerateOptions go;
  go.max_tokens = a.max_tokens;
  go.ignore_eos = a.ignore_eos;
  go.prefill_chunk = a.prefill_chunk;
  go.sampling = sampling_of(a);
  go.speculation = a.speculation;
  TextStreamer streamer(tokenizer.get());
  auto out = generate(**model, prompt, go, [&](const SampledToken& t) { streamer.push(t.id); });
  if (!out.is_ok()) {
    std::fputc('\n', stdout);
    return fail(out.status().to_string());
  }
  streamer.finish();
  print_speculation(a, (*model)->metrics());
  if (a.print_ids) print_ids(out->ids);
  return 0;
}

}  // namespace

Runner add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  add_model_flag(app, a->model, "HF model directory or .gguf file");
  app.add_option("--prompt", a->prompt, "prompt text (BOS and template tokens added)");
  app.add_option("--prompt-ids", a->prompt_ids, "prompt as comma-separated token ids, or @FILE holding them");
  app.add_option("--max-tokens", a->max_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-p", a->top_p)->capture_default_str();
  app.add_option("--top-k", a->top_k, "0 = off")->capture_default_str();
  app.add_option("--min-p", a->min_p)->capture_default_str();
  app.add_option("--repetition-penalty", a->repetition_penalty)->capture_default_str();
  app.add_option("--seed", a->seed, "sampling seed (same seed, same output)")
      ->each([a](const std::string&) { a->seed_set = true; });
  app.add_flag("--print-ids", a->print_ids, "print the generated ids, comma-separated, on the last line");
  app.add_flag("--ignore-eos", a->ignore_eos, "do not stop at end-of-sequence tokens");
  add_block_size_flag(app, a->block_size);
  add_window_pool_flag(app, a->kv_window_pool);
  // --threads (0: all, or with --tp the cores each shard is bound to), --quant, --kv-dtype, ...;
  // --device applies with --tp (this process computes on the CPU).
  add_shard_runtime_flags(app, a->shard, ShardFlagsFor::kLauncher);
  app.add_option("--prefill-chunk", a->prefill_chunk, "prefill in chunks of N tokens (0 = whole prompt)");
  app.add_option("--speculation", a->speculation_mode,
                 "speculative decoding: off, auto (drafts gated by measured acceptance), ngram (always), draft (the "
                 "self-draft, always; needs --spec-draft-layers)")
      ->check(CLI::IsMember({"off", "auto", "ngram", "draft"}))
      ->capture_default_str();
  app.add_option("--spec-depth", a->speculation.max_depth, "most drafts per step")->capture_default_str();
  app.add_option("--spec-draft-layers", a->speculation.draft_layers,
                 "self-draft over the model's first N layers (0: none)")
      ->capture_default_str();
  app.add_option("--spec-draft-vocab", a->speculation.draft_vocab, "the self-draft head's fixed rows (ids below N)")
      ->capture_default_str();
  app.add_option("--tp", a->tp, "run through a coordinator and N tensor-parallel shard processes (mpirun for N > 1)");
  app.add_option("--hosts", a->hosts, "with --tp: hosts for mpirun (comma-separated)")->delimiter(',');
  app.add_option("--shard-arg", a->shard_args, "with --tp: an extra argument for every shard (repeatable)")
      ->allow_extra_args(false)->group("");
  app.add_option("--max-kv-mb", a->max_kv_mb, "with --tp: cap on each shard's KV cache")->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", a->heartbeat_timeout_ms, "with --tp: declare a silent shard dead")
      ->capture_default_str();
  return [a] {
    const Status model = resolve_model_flag(a->model);
    if (!model.is_ok()) return fail(model.to_string());
    a->speculation.mode = *parse_spec_mode(a->speculation_mode);
    const Status spec = validate_speculation_config(a->speculation);
    if (!spec.is_ok()) return fail(spec.message());
    return run_generate(*a);
  };
}

}  // namespace tessera::cli
