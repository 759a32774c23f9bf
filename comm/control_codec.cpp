// The one adapter to Cap'n Proto: every library exception is caught here and becomes a Status.
#include "comm/control_codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "proto/tessera.capnp.h"

namespace tessera {
namespace {

void write_sampling(proto::SamplingParams::Builder b, const SamplingParams& s) {
  b.setTemperature(s.temperature);
  b.setTopK(s.top_k);
  b.setTopP(s.top_p);
  b.setMinP(s.min_p);
  b.setRepetitionPenalty(s.repetition_penalty);
  b.setPresencePenalty(s.presence_penalty);
  b.setFrequencyPenalty(s.frequency_penalty);
  b.setSeed(s.seed);
  b.setHasSeed(s.has_seed);
  b.setNLogprobs(s.n_logprobs);
  b.setReturnLogprob(s.return_logprob);
  auto bias = b.initLogitBias(static_cast<unsigned>(s.logit_bias.size()));
  for (unsigned i = 0; i < s.logit_bias.size(); ++i) {
    bias[i].setId(s.logit_bias[i].first);
    bias[i].setBias(s.logit_bias[i].second);
  }
}

SamplingParams read_sampling(proto::SamplingParams::Reader r) {
  SamplingParams s;
  s.temperature = r.getTemperature();
  s.top_k = r.getTopK();
  s.top_p = r.getTopP();
  s.min_p = r.getMinP();
  s.repetition_penalty = r.getRepetitionPenalty();
  s.presence_penalty = r.getPresencePenalty();
  s.frequency_penalty = r.getFrequencyPenalty();
  s.seed = r.getSeed();
  s.has_seed = r.getHasSeed();
  s.n_logprobs = r.getNLogprobs();
  s.return_logprob = r.getReturnLogprob();
  for (auto b : r.getLogitBias()) s.logit_bias.emplace_back(b.getId(), b.getBias());
  return s;
}

template <typename ListBuilder, typename Vec>
void fill_list(ListBuilder b, const Vec& v) {
  for (unsigned i = 0; i < v.size(); ++i) b.set(i, v[i]);
}

template <typename T, typename ListReader>
std::vector<T> read_list(ListReader r) {
  std::vector<T> v;
  v.reserve(r.size());
  for (auto x : r) v.push_back(static_cast<T>(x));
  return v;
}

static_assert(static_cast<int>(proto::KvDtype::FP32) == static_cast<int>(KvDtype::kF32) &&
                  static_cast<int>(proto::KvDtype::FP16) == static_cast<int>(KvDtype::kF16) &&
                  static_cast<int>(proto::KvDtype::BF16) == static_cast<int>(KvDtype::kBF16) &&
                  static_cast<int>(proto::KvDtype::FP8) == static_cast<int>(KvDtype::kFp8) &&
                  static_cast<int>(proto::KvDtype::INT8) == static_cast<int>(KvDtype::kInt8),
              "proto/tessera.capnp's KvDtype must list common/kv_config.h's in order");

// An enum value a newer peer may send that this build does not know is a malformed message.
KvDtype read_kv_dtype(proto::KvDtype d) {
  const auto v = static_cast<int>(d);
  if (v < 0 || v > static_cast<int>(KvDtype::kInt8)) throw std::runtime_error("unknown KV dtype " + std::to_string(v));
  return static_cast<KvDtype>(v);
}

struct Writer {
  proto::Envelope::Builder env;

  void operator()(const ShardHello& h) {
    auto b = env.initHello();
    b.setRank(h.rank);
    b.setWorldSize(h.world_size);
    b.setTpSize(h.tp_size);
    b.setDevice(h.device);
    b.setMemoryAvailableBytes(h.memory_available_bytes);
    b.setKvBytesPerToken(h.kv_bytes_per_token);
    b.setModelFingerprint(h.model_fingerprint);
    b.setHostname(h.hostname);
    b.setPid(h.pid);
    b.setWeightBytes(h.weight_bytes);
    b.setMaxStepTokens(h.max_step_tokens);
    b.setMaxStepSeqs(h.max_step_seqs);
    b.setKvDtype(static_cast<proto::KvDtype>(h.kv_dtype));
    b.setKvWindow(h.kv_window);
    b.setKvWindowBytesPerToken(h.kv_window_bytes_per_token);
    b.setKvSummaryBytesPerBlock(h.kv_summary_bytes_per_block);
  }
  void operator()(const ConfigureMsg& c) {
    auto b = env.initConfigure();
    b.setNumBlocks(c.num_blocks);
    b.setBlockSize(c.block_size);
    b.setKvDtype(static_cast<proto::KvDtype>(c.kv_dtype));
    b.setNumWindowBlocks(c.num_window_blocks);
    b.setDraftLayers(c.draft_layers);
    b.setDraftVocab(c.draft_vocab);
    if (!c.draft_ids.empty()) fill_list(b.initDraftIds(static_cast<unsigned>(c.draft_ids.size())), c.draft_ids);
  }
  void operator()(const StepPlan& p) {
    auto b = env.initStep();
    b.setStepId(p.step_id);
    auto news = b.initNewSequences(static_cast<unsigned>(p.new_sequences.size()));
    for (unsigned i = 0; i < p.new_sequences.size(); ++i) {
      const NewSequence& n = p.new_sequences[i];
      news[i].setSeqId(n.seq_id);
      fill_list(news[i].initPromptIds(static_cast<unsigned>(n.prompt_ids.size())), n.prompt_ids);
      write_sampling(news[i].initSampling(), n.sampling);
    }
    auto sched = b.initScheduled(static_cast<unsigned>(p.scheduled.size()));
    for (unsigned i = 0; i < p.scheduled.size(); ++i) {
      const ScheduledSequence& s = p.scheduled[i];
      sched[i].setSeqId(s.seq_id);
      sched[i].setStartPos(s.start_pos);
      sched[i].setNumTokens(s.num_tokens);
      sched[i].setSample(s.sample);
      sched[i].setResetBlocks(s.reset_blocks);
      sched[i].setPromptLogprobs(s.prompt_logprobs);
      fill_list(sched[i].initAppendBlocks(static_cast<unsigned>(s.append_blocks.size())), s.append_blocks);
      if (!s.banned_tokens.empty())
        fill_list(sched[i].initBannedTokens(static_cast<unsigned>(s.banned_tokens.size())), s.banned_tokens);
      if (!s.append_window_blocks.empty())
        fill_list(sched[i].initAppendWindowBlocks(static_cast<unsigned>(s.append_window_blocks.size())),
                  s.append_window_blocks);
      if (!s.draft_tokens.empty())
        fill_list(sched[i].initDraftTokens(static_cast<unsigned>(s.draft_tokens.size())), s.draft_tokens);
      if (!s.token_mask.empty())
        fill_list(sched[i].initTokenMask(static_cast<unsigned>(s.token_mask.size())), s.token_mask);
      sched[i].setForcedDrafts(s.forced_drafts);
      sched[i].setMaskFollows(s.mask_follows);
    }
    fill_list(b.initFinished(static_cast<unsigned>(p.finished.size())), p.finished);
    auto copies = b.initBlockCopies(static_cast<unsigned>(p.block_copies.size()));
    for (unsigned i = 0; i < p.block_copies.size(); ++i) {
      copies[i].setSrc(p.block_copies[i].src);
      copies[i].setDst(p.block_copies[i].dst);
    }
    if (!p.window_block_copies.empty()) {
      auto wcopies = b.initWindowBlockCopies(static_cast<unsigned>(p.window_block_copies.size()));
      for (unsigned i = 0; i < p.window_block_copies.size(); ++i) {
        wcopies[i].setSrc(p.window_block_copies[i].src);
        wcopies[i].setDst(p.window_block_copies[i].dst);
      }
    }
  }
  void operator()(const StepResult& r) {
    auto b = env.initResult();
    b.setStepId(r.step_id);
    b.setRank(r.rank);
    b.setError(r.error);
    b.setComputeMicros(r.compute_micros);
    b.setCommMicros(r.comm_micros);
    b.setDraftMicros(r.draft_micros);
    b.setSparseThresholdTokens(r.sparse_threshold_tokens);
    b.setSparseDecodes(r.sparse_decodes);
    b.setDenseGlobalDecodes(r.dense_global_decodes);
    auto pls = b.initPromptLogprobs(static_cast<unsigned>(r.prompt_logprobs.size()));
    for (unsigned i = 0; i < r.prompt_logprobs.size(); ++i) {
      const PromptLogprob& p = r.prompt_logprobs[i];
      pls[i].setSeqId(p.seq_id);
      pls[i].setPosition(p.position);
      pls[i].setToken(p.token);
      pls[i].setLogprob(p.logprob);
      auto top = pls[i].initTopLogprobs(static_cast<unsigned>(p.top_logprobs.size()));
      for (unsigned j = 0; j < p.top_logprobs.size(); ++j) {
        top[j].setToken(p.top_logprobs[j].first);
        top[j].setLogprob(p.top_logprobs[j].second);
      }
    }
    auto toks = b.initTokens(static_cast<unsigned>(r.tokens.size()));
    for (unsigned i = 0; i < r.tokens.size(); ++i) {
      const StepToken& t = r.tokens[i];
      toks[i].setSeqId(t.seq_id);
      toks[i].setToken(t.token);
      toks[i].setLogprob(t.logprob);
      auto top = toks[i].initTopLogprobs(static_cast<unsigned>(t.top_logprobs.size()));
      for (unsigned j = 0; j < t.top_logprobs.size(); ++j) {
        top[j].setToken(t.top_logprobs[j].first);
        top[j].setLogprob(t.top_logprobs[j].second);
      }
    }
  }
  void operator()(const Heartbeat& h) {
    auto b = env.initHeartbeat();
    b.setRank(h.rank);
    b.setLastStepId(h.last_step_id);
  }
  void operator()(const ShutdownMsg& s) { env.setShutdown(s.reason); }
  void operator()(const AbortMsg& a) { fill_list(env.initAbort(static_cast<unsigned>(a.seq_ids.size())), a.seq_ids); }
  void operator()(const RefusedMsg& r) { env.setRefused(r.reason); }
  void operator()(const StepMasks& m) {
    auto b = env.initMasks();
    b.setStepId(m.step_id);
    auto masks = b.initMasks(static_cast<unsigned>(m.masks.size()));
    for (unsigned i = 0; i < m.masks.size(); ++i) {
      masks[i].setSeqId(m.masks[i].seq_id);
      if (!m.masks[i].token_mask.empty())
        fill_list(masks[i].initTokenMask(static_cast<unsigned>(m.masks[i].token_mask.size())), m.masks[i].token_mask);
    }
  }
};

ControlMessage read_envelope(proto::Envelope::Reader env) {
  switch (env.which()) {
    case proto::Envelope::HELLO: {
      auto r = env.getHello();
      ShardHello h;
      h.rank = r.getRank();
      h.world_size = r.getWorldSize();
      h.tp_size = r.getTpSize();
      h.device = r.getDevice();
      h.memory_available_bytes = r.getMemoryAvailableBytes();
      h.kv_bytes_per_token = r.getKvBytesPerToken();
      h.model_fingerprint = r.getModelFingerprint();
      h.hostname = r.getHostname();
      h.pid = r.getPid();
      h.weight_bytes = r.getWeightBytes();
      h.max_step_tokens = r.getMaxStepTokens();
      h.max_step_seqs = r.getMaxStepSeqs();
      h.kv_dtype = read_kv_dtype(r.getKvDtype());
      h.kv_window = r.getKvWindow();
      h.kv_window_bytes_per_token = r.getKvWindowBytesPerToken();
      h.kv_summary_bytes_per_block = r.getKvSummaryBytesPerBlock();
      return h;
    }
    case proto::Envelope::CONFIGURE: {
      auto r = env.getConfigure();
      ConfigureMsg c{r.getNumBlocks(), r.getBlockSize(), read_kv_dtype(r.getKvDtype()), r.getNumWindowBlocks()};
      c.draft_layers = r.getDraftLayers();
      c.draft_vocab = r.getDraftVocab();
      c.draft_ids = read_list<int32_t>(r.getDraftIds());
      return c;
    }
    case proto::Envelope::STEP: {
      auto r = env.getStep();
      StepPlan p;
      p.step_id = r.getStepId();
      for (auto n : r.getNewSequences())
        p.new_sequences.push_back({n.getSeqId(), read_list<int32_t>(n.getPromptIds()), read_sampling(n.getSampling())});
      for (auto s : r.getScheduled()) {
        ScheduledSequence q;
        q.seq_id = s.getSeqId();
        q.start_pos = s.getStartPos();
        q.num_tokens = s.getNumTokens();
        q.sample = s.getSample();
        q.reset_blocks = s.getResetBlocks();
        q.prompt_logprobs = s.getPromptLogprobs();
        q.append_blocks = read_list<int32_t>(s.getAppendBlocks());
        q.banned_tokens = read_list<int32_t>(s.getBannedTokens());
        q.append_window_blocks = read_list<int32_t>(s.getAppendWindowBlocks());
        q.draft_tokens = read_list<int32_t>(s.getDraftTokens());
        q.token_mask = read_list<uint32_t>(s.getTokenMask());
        q.forced_drafts = s.getForcedDrafts();
        q.mask_follows = s.getMaskFollows();
        p.scheduled.push_back(std::move(q));
      }
      p.finished = read_list<uint64_t>(r.getFinished());
      for (auto c : r.getBlockCopies()) p.block_copies.push_back({c.getSrc(), c.getDst()});
      for (auto c : r.getWindowBlockCopies()) p.window_block_copies.push_back({c.getSrc(), c.getDst()});
      return p;
    }
    case proto::Envelope::RESULT: {
      auto r = env.getResult();
      StepResult res;
      res.step_id = r.getStepId();
      res.rank = r.getRank();
      res.error = r.getError();
      res.compute_micros = r.getComputeMicros();
      res.comm_micros = r.getCommMicros();
      res.draft_micros = r.getDraftMicros();
      res.sparse_threshold_tokens = r.getSparseThresholdTokens();
      res.sparse_decodes = r.getSparseDecodes();
      res.dense_global_decodes = r.getDenseGlobalDecodes();
      for (auto t : r.getTokens()) {
        StepToken st{t.getSeqId(), t.getToken(), t.getLogprob(), {}};
        for (auto tl : t.getTopLogprobs()) st.top_logprobs.emplace_back(tl.getToken(), tl.getLogprob());
        res.tokens.push_back(std::move(st));
      }
      for (auto p : r.getPromptLogprobs()) {
        PromptLogprob pl{p.getSeqId(), p.getPosition(), p.getToken(), p.getLogprob(), {}};
        for (auto tl : p.getTopLogprobs()) pl.top_logprobs.emplace_back(tl.getToken(), tl.getLogprob());
        res.prompt_logprobs.push_back(std::move(pl));
      }
      return res;
    }
    case proto::Envelope::HEARTBEAT: {
      auto r = env.getHeartbeat();
      return Heartbeat{r.getRank(), r.getLastStepId()};
    }
    case proto::Envelope::SHUTDOWN: return ShutdownMsg{env.getShutdown()};
    case proto::Envelope::ABORT: return AbortMsg{read_list<uint64_t>(env.getAbort())};
    case proto::Envelope::REFUSED: return RefusedMsg{env.getRefused()};
    case proto::Envelope::MASKS: {
      auto r = env.getMasks();
      StepMasks m;
      m.step_id = r.getStepId();
      for (auto s : r.getMasks()) m.masks.push_back({s.getSeqId(), read_list<uint32_t>(s.getTokenMask())});
      return m;
    }
  }
  throw std::runtime_error("unknown message kind " + std::to_string(static_cast<int>(env.which())));
}

}  // namespace

std::string encode_message(const ControlMessage& message, uint32_t version) {
  capnp::MallocMessageBuilder builder;
  auto env = builder.initRoot<proto::Envelope>();
  env.setProtocolVersion(version);
  std::visit(Writer{env}, message);
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

Result<ControlMessage> decode_message(const void* data, size_t size) {
  if (size == 0 || size % sizeof(capnp::word) != 0)
    return Status::corrupt("control message of " + std::to_string(size) + " bytes is not a whole number of words");
  // ZeroMQ frames are not 8-byte aligned in general; Cap'n Proto requires alignment.
  std::vector<capnp::word> aligned(size / sizeof(capnp::word));
  std::memcpy(aligned.data(), data, size);
  try {
    capnp::ReaderOptions options;
    // Bounds the words a read may visit to a few times the message's own: an honest message is
    // read once, while a hostile one can point many times at the same data (or at lists of
    // empty structs) and make a small frame cost seconds (found by fuzz/control_codec_fuzz.cpp).
    options.traversalLimitInWords = 8 * aligned.size() + 1024;
    options.nestingLimit = 16;
    capnp::FlatArrayMessageReader reader(kj::ArrayPtr<const capnp::word>(aligned.data(), aligned.size()), options);
    auto env = reader.getRoot<proto::Envelope>();
    if (env.getProtocolVersion() != kProtocolVersion)
      return Status::invalid_argument("protocol version " + std::to_string(env.getProtocolVersion()) + ", expected " +
                                      std::to_string(kProtocolVersion));
    return read_envelope(env);
  } catch (const kj::Exception& e) {
    return Status::corrupt(std::string("malformed control message: ") + e.getDescription().cStr());
  } catch (const std::exception& e) {
    return Status::corrupt(std::string("malformed control message: ") + e.what());
  }
}

}  // namespace tessera
