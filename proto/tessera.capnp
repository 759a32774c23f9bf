@0x9ba24c852429c1c3;
# Tessera control plane: coordinator <-> shards. See proto/README.md for the conversation.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tessera::proto");

const protocolVersion :UInt32 = 1;

struct SamplingParams {
  temperature @0 :Float32 = 1.0;
  topK @1 :Int32;
  topP @2 :Float32 = 1.0;
  minP @3 :Float32;
  repetitionPenalty @4 :Float32 = 1.0;
  presencePenalty @5 :Float32;
  frequencyPenalty @6 :Float32;
  seed @7 :UInt64;
  hasSeed @8 :Bool;
  nLogprobs @9 :Int32;
  returnLogprob @10 :Bool;
  logitBias @11 :List(TokenBias);  # OpenAI's logit_bias: ids ascending
}

struct TokenBias {
  id @0 :Int32;
  bias @1 :Float32;
}

struct ShardHello {
  rank @0 :Int32;
  worldSize @1 :Int32;
  tpSize @2 :Int32;
  device @3 :Text;                 # "cpu (2 threads, cpus 0-1)", "cuda:0 NVIDIA H200"
  memoryAvailableBytes @4 :UInt64; # for KV after weights and workspace
  kvBytesPerToken @5 :UInt64;      # this shard's KV bytes per token (all layers, its heads)
  modelFingerprint @6 :Text;       # config + file identity; must agree on every rank
  hostname @7 :Text;
  pid @8 :Int32;
  weightBytes @9 :UInt64;
  maxStepTokens @10 :Int64;        # largest step the shard's workspace holds (0: no limit)
  maxStepSeqs @11 :Int64;          # most sequences in one step (0: no limit)
  kvDtype @12 :KvDtype;            # the elements its KV cache stores (the coordinator checks it)
  kvWindow @13 :Int64;             # sliding window of its windowed layers (0: none; every layer sees all keys)
  kvWindowBytesPerToken @14 :UInt64;  # of kvBytesPerToken, the bytes of the windowed layers (0 when kvWindow is 0)
  kvSummaryBytesPerBlock @15 :UInt64; # sparse attention's key summaries per main-pool block (0: none)
}

# common/kv_config.h's KvDtype, same order.
enum KvDtype {
  fp32 @0;
  fp16 @1;
  bf16 @2;
  fp8 @3;
  int8 @4;
}

struct Configure {
  numBlocks @0 :Int64;
  blockSize @1 :Int32;
  kvDtype @2 :KvDtype;             # what the coordinator planned with; the shard checks it
  numWindowBlocks @3 :Int64;       # > 0: the windowed layers' KV lives in a pool of its own (window tables)
  draftLayers @4 :Int32;           # > 0: build the self-draft (speculation) over the first this many layers
  draftVocab @5 :Int32;            # its head's fixed rows: token ids below this (plus each context's ids)
  draftIds @6 :List(Int32);        # or these ids (the tokenizer's most frequent), when given
}

struct NewSequence {
  seqId @0 :UInt64;
  promptIds @1 :List(Int32);
  sampling @2 :SamplingParams;
}

# One sequence's piece of a step: compute tokens [startPos, startPos + numTokens) of its token
# list (prompt, then generated tokens) and sample one token after it when `sample` is set.
struct ScheduledSequence {
  seqId @0 :UInt64;
  startPos @1 :Int64;
  numTokens @2 :Int32;
  sample @3 :Bool;
  appendBlocks @4 :List(Int32);  # appended to the block table before the step
  resetBlocks @5 :Bool;          # clear the table first (preemption / recompute)
  promptLogprobs @6 :Bool;       # report the logprob of every prompt token this piece predicts
  bannedTokens @7 :List(Int32);  # never sampled this step (EOS until min_tokens is reached)
  appendWindowBlocks @8 :List(Int32);  # the window table's entries for the same blocks (-1: released)
  draftTokens @9 :List(Int32);   # speculation: proposed tokens after the last known one, verified this step
                                 # (-1 throughout: the shard's self-draft proposes them)
  tokenMask @10 :List(UInt32);   # structured outputs: allowed tokens per sampled row (1, or k + 1 with drafts), a bit per token (empty: all)
  forcedDrafts @11 :Bool;        # the drafts are certain (jump-forward): taken without logits, only the row after them sampled
  maskFollows @12 :Bool;         # tokenMask comes in the StepMasks message after this plan (computed during the forward pass)
}

struct SequenceMask {
  seqId @0 :UInt64;
  tokenMask @1 :List(UInt32);    # empty: no constraint
}

struct StepMasks {
  stepId @0 :UInt64;
  masks @1 :List(SequenceMask);  # one per piece marked maskFollows, in the plan's order
}

struct BlockCopy {
  src @0 :Int32;
  dst @1 :Int32;
}

struct StepPlan {
  stepId @0 :UInt64;
  newSequences @1 :List(NewSequence);
  scheduled @2 :List(ScheduledSequence);
  finished @3 :List(UInt64);     # drop state of these sequences (finished or aborted)
  blockCopies @4 :List(BlockCopy);  # copy-on-write, done before the step
  windowBlockCopies @5 :List(BlockCopy);  # the same, in the window pool
}

struct TopLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
}

struct SampledToken {
  seqId @0 :UInt64;
  token @1 :Int32;
  logprob @2 :Float32;
  topLogprobs @3 :List(TopLogprob);
}

# Logprob of the prompt token at `position`, predicted by position - 1 (echo + logprobs).
struct PromptLogprob {
  seqId @0 :UInt64;
  position @1 :Int64;
  token @2 :Int32;
  logprob @3 :Float32;
  topLogprobs @4 :List(TopLogprob);
}

struct StepResult {
  stepId @0 :UInt64;
  rank @1 :Int32;
  tokens @2 :List(SampledToken);   # rank 0 only
  error @3 :Text;                   # empty: ok
  computeMicros @4 :UInt64;
  commMicros @5 :UInt64;
  promptLogprobs @6 :List(PromptLogprob);  # rank 0 only
  draftMicros @7 :UInt64;           # of computeMicros, the time its self-draft took
  sparseThresholdTokens @8 :Int64;  # sparse decode attention from this context (0: off)
  sparseDecodes @9 :UInt64;         # this step's decode pieces x global layers attended sparsely
  denseGlobalDecodes @10 :UInt64;   # ... and densely
}

struct Heartbeat {
  rank @0 :Int32;                   # -1: the coordinator
  lastStepId @1 :UInt64;
}

struct Envelope {
  protocolVersion @0 :UInt32;
  union {
    hello @1 :ShardHello;
    configure @2 :Configure;
    step @3 :StepPlan;
    result @4 :StepResult;
    heartbeat @5 :Heartbeat;
    shutdown @6 :Text;              # reason
    abort @7 :List(UInt64);         # sequences to drop now
    refused @8 :Text;               # a peer refused our message (version mismatch, malformed)
    masks @9 :StepMasks;            # the token masks of the plan just sent (its maskFollows pieces)
  }
}
