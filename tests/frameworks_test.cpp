// Carrying a plan into Megatron-LM and torchtitan: export then import simulates the same for every
// schedule the framework runs, what it cannot run is refused by field, and the nearest runnable plan
// changes only those fields (docs/frameworks.md).
#include <algorithm>

#include "frameworks.h"
#include "helpers.h"
#include "megatron_args.h"
#include "torchtitan_toml.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

std::vector<int> split_of(const Config& config) {
  Config copy = config;
  Result<PlannedLayout> planned = plan_layout(copy);
  if (!planned.ok()) FAIL(planned.error().message);
  std::vector<int> split;
  for (const VirtualStage& stage : planned.value().layout.stages) split.push_back(stage.layers);
  return split;
}

/// The config through the framework's file and back, as `pipesim import` reads it.
Config round_trip(const Config& config, Framework framework) {
  REQUIRE(unsupported(framework, config, split_of(config)).empty());
  Result<ImportedConfig> imported =
      framework == Framework::Megatron
          ? config_from_megatron(megatron_arguments(config, split_of(config), "test"), "args", std::nullopt)
          : config_from_torchtitan(torchtitan_toml(config, split_of(config), "test"), "job.toml", std::nullopt);
  if (!imported.ok()) FAIL(imported.error().message);
  Config back = parse_or_fail(imported.value().config.dump());
  back.hardware = config.hardware;  // the machine is no part of a framework's file
  return back;
}

/// Same iteration time and per-device peaks.
void check_same_run(const Config& a, const Config& b) {
  const Simulated x = simulate_or_fail(a), y = simulate_or_fail(b);
  CHECK(x.metrics.iteration_ns == y.metrics.iteration_ns);
  REQUIRE(x.metrics.devices.size() == y.metrics.devices.size());
  for (std::size_t d = 0; d < x.metrics.devices.size(); ++d)
    CHECK(x.metrics.devices[d].peak_memory_bytes == y.metrics.devices[d].peak_memory_bytes);
}

/// Llama-3-8B's shape (one of torchtitan's flavors) on 8 GPUs, small enough to simulate in milliseconds.
Config llama(const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"parallel.microbatches=8", "model.seq_len=1024"};
  all.insert(all.end(), sets.begin(), sets.end());
  return source_config("default.json", all);
}

}  // namespace

TEST_CASE("Megatron-LM: export then import simulates the same, for both schedules it runs") {
  const std::string schedule = GENERATE("1f1b", "interleaved-1f1b");
  using Sets = std::vector<std::string>;
  const Sets sets = GENERATE(Sets{}, Sets{"parallel.pp=4", "parallel.dp=2", "training.zero_stage=1", "precision.fp8=hybrid",
                                          "training.kernels=fused", "training.overlap_grad_reduce=true",
                                          "training.bucket_size=5000000"},
                             Sets{"parallel.pp=2", "parallel.tp=2", "parallel.dp=2", "training.zero_stage=3",
                                  "training.recompute_granularity=full", "training.recompute_method=block",
                                  "training.recompute_num_layers=2", "training.overlap_grad_reduce=true"},
                             Sets{"parallel.pp=4", "parallel.cp=2", "training.zero_stage=2", "parallel.dp=1"},
                             // Transformer Engine's SM margins travel in a comment (--tp-comm-overlap-cfg sets them)
                             Sets{"parallel.pp=2", "parallel.tp=4", "parallel.sequence_parallel=true",
                                  "training.tp_comm_overlap=true", "training.tp_comm_overlap_proj_sms=24",
                                  "training.tp_comm_overlap_fc2_sms=20"});
  Sets all = sets;
  all.push_back("schedule.name=" + schedule);
  CAPTURE(all);
  const Config config = llama(all);
  check_same_run(config, round_trip(config, Framework::Megatron));
}

TEST_CASE("Megatron-LM: a MoE plan travels with its experts, routing, expert parallelism and attention") {
  // DeepSeek-V3's shape: latent attention, dense first layers (a --moe-layer-freq list), routing groups,
  // the flex dispatcher with an MXFP8 dispatch; and Mixtral's: GQA, every layer MoE.
  const std::string schedule = GENERATE("1f1b", "interleaved-1f1b");
  const Config deepseek = source_config(
      "deepseek-v3.json", {"schedule.name=" + schedule, "parallel.microbatches=16",
                           "training.overlap_p2p_comm=" + std::string(schedule == "1f1b" ? "false" : "true")});
  const Config back = round_trip(deepseek, Framework::Megatron);
  CHECK(back.model.moe_layer_pattern == deepseek.model.moe_layer_pattern);
  CHECK(back.model.moe_router_group_topk == 4);
  CHECK(back.training.moe_dispatch_mxfp8);
  check_same_run(deepseek, back);
  const Config mixtral = source_config("mixtral-8x7b.json", {"schedule.name=1f1b", "parallel.chunks=1",
                                                             "training.overlap_p2p_comm=false",
                                                             "model.moe_capacity_factor=1.25", "model.moe_imbalance=1.5"});
  check_same_run(mixtral, round_trip(mixtral, Framework::Megatron));
}

TEST_CASE("Megatron-LM: --moe-layer-freq is an integer or a Python list expression of 0s and 1s") {
  const std::string base = "--num-layers 12 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 1 "
                           "--global-batch-size 8 --vocab-size 1000 --num-experts 4 --moe-layer-freq ";
  const auto freq = [&](const std::string& value) {
    Result<ImportedConfig> r = config_from_megatron(base + value, "a.args", 8);
    return r.ok() ? r.value().config["model"]["moe_layer_freq"].dump() : r.error().message;
  };
  CHECK(freq("2") == "2");
  CHECK(freq("\"([1]*3+[0]*1)*3\"") == "[1,1,1,0,1,1,1,0,1,1,1,0]");  // Megatron-LM's own example
  CHECK(freq("([0]*2+[1]*10)") == "[0,0,1,1,1,1,1,1,1,1,1,1]");
  CHECK(freq("[0,1,0,1,0,1,0,1,0,1,0,1]") == "[0,1,0,1,0,1,0,1,0,1,0,1]");
  CHECK_THAT(freq("([0]*2+[1]*10"), Catch::Contains("--moe-layer-freq ([0]*2+[1]*10: expected an integer or a list"));
  CHECK_THAT(freq("range(12)"), Catch::Contains("expected an integer or a list"));
}

TEST_CASE("Megatron-LM: a split uneven only at the ends travels as --decoder-first/last-pipeline-num-layers") {
  const Config config = llama({"schedule.vocab=redistribute", "schedule.layers_per_stage=[1,5,5,5,5,5,5,1]"});
  const std::string args = megatron_arguments(config, split_of(config), "test");
  CHECK_THAT(args, Catch::Contains("--decoder-first-pipeline-num-layers 1\n") &&
                       Catch::Contains("--decoder-last-pipeline-num-layers 1\n"));
  check_same_run(config, round_trip(config, Framework::Megatron));
}

TEST_CASE("Megatron-LM: stages for the embedding and the loss travel as --account-for-embedding/loss-in-pipeline-split") {
  CHECK(accounts_for_vocabulary({0, 1, 1, 1, 1, 0}));
  CHECK(accounts_for_vocabulary({3, 4, 4, 3}));
  CHECK(accounts_for_vocabulary({1, 1}));
  CHECK_FALSE(accounts_for_vocabulary({4, 4, 4, 4}));
  CHECK_FALSE(accounts_for_vocabulary({0, 1, 2, 0}));
  CHECK_FALSE(accounts_for_vocabulary({1}));
  // Llama 3 405B's layout (docs/config.md) in miniature: 30 layers on 4 devices of 8 one-layer chunks.
  const Config config = llama({"schedule.name=interleaved-1f1b", "schedule.vocab=redistribute", "parallel.pp=4",
                               "parallel.chunks=8", "model.layers=30"});
  const std::vector<int> split = split_of(config);
  CHECK(split.front() == 0);
  CHECK(split.back() == 0);
  CHECK(unsupported(Framework::Megatron, config, split).empty());
  const std::string args = megatron_arguments(config, split, "test");
  CHECK_THAT(args, Catch::Contains("--account-for-embedding-in-pipeline-split\n") &&
                       Catch::Contains("--account-for-loss-in-pipeline-split\n") &&
                       !Catch::Contains("--decoder-first-pipeline-num-layers"));
  check_same_run(config, round_trip(config, Framework::Megatron));
  // Megatron-LM needs the layers and the two counted for the vocabulary to split evenly.
  std::string uneven = args;
  uneven.replace(uneven.find("--num-layers 30"), 15, "--num-layers 29");
  CHECK_THAT(config_from_megatron(uneven, "a.args", std::nullopt).error().message,
             Catch::Contains("a.args: --account-for-embedding/loss-in-pipeline-split: 29 layers and 2 counted for the "
                             "vocabulary do not split evenly over 32 virtual stages"));
}

TEST_CASE("torchtitan: export then import simulates the same, for every schedule it names") {
  const std::string schedule = GENERATE("gpipe", "1f1b", "interleaved-1f1b", "zb-v", "dualpipe-v");
  using Sets = std::vector<std::string>;
  const Sets sets = GENERATE(Sets{"parallel.microbatches=16"},
                             Sets{"parallel.microbatches=16", "parallel.pp=4", "parallel.dp=2", "training.zero_stage=3",
                                  "precision.fp8=e4m3"},
                             Sets{"parallel.microbatches=16", "parallel.pp=2", "parallel.tp=2", "parallel.dp=2",
                                  "training.zero_stage=2", "training.recompute_granularity=full"},
                             // per-op selective checkpointing: [activation_checkpoint] selective_ac_option "op"
                             Sets{"parallel.microbatches=16", "parallel.dp=2", "training.zero_stage=3",
                                  "training.recompute_granularity=selective_op"},
                             // uncompiled with the 2024 releases' RMSNorm in tensor ops: [model] norm_type "rmsnorm"
                             Sets{"parallel.microbatches=16", "training.kernels=composite"},
                             // async tensor parallelism: no Transformer Engine SM margin, under torch.compile
                             Sets{"parallel.microbatches=16", "parallel.pp=2", "parallel.tp=2",
                                  "parallel.sequence_parallel=true", "training.tp_comm_overlap=true",
                                  "training.tp_comm_overlap_proj_sms=0", "training.tp_comm_overlap_fc2_sms=0",
                                  "training.kernels=fused"});
  Sets all = sets;
  // Uncompiled, its Llama applies the rotary embedding as tensor ops.
  if (std::ranges::find(sets, std::string("training.kernels=fused")) == sets.end())
    all.push_back("training.rotary_embedding=tensor_ops");
  all.push_back("schedule.name=" + schedule);
  all.push_back("training.overlap_p2p_comm=true");  // PyTorch's pipelining overlaps its transfers
  all.push_back("training.activation_layout=bsh");  // DTensor's layers: batch first
  CAPTURE(all);
  const Config config = llama(all);
  const Config back = round_trip(config, Framework::Torchtitan);
  CHECK(back.schedule.name == schedule);
  check_same_run(config, back);
}

TEST_CASE("what a framework cannot run is refused by field, and the nearest plan changes only those fields") {
  const Config config = llama({"schedule.name=zb-v", "schedule.vocab=vocab-2", "parallel.dp=2",
                               "parallel.pp=4", "training.zero_stage=1", "training.optimizer_post_validation=true"});
  std::vector<std::string> fields;
  for (const Unsupported& u : unsupported(Framework::Megatron, config, split_of(config))) fields.push_back(u.field);
  CHECK(fields == std::vector<std::string>{"schedule.name", "schedule.vocab", "training.optimizer_post_validation"});
  std::vector<std::string> changes;
  const Config nearest = nearest_runnable(Framework::Megatron, config, split_of(config), changes);
  CHECK(changes.size() == 3);
  CHECK(nearest.schedule.name == "1f1b");
  CHECK(nearest.schedule.vocab == VocabMode::Baseline);
  CHECK(nearest.training.zero_stage == 1);  // Megatron's distributed optimizer
  CHECK(unsupported(Framework::Megatron, nearest, split_of(nearest)).empty());

  fields.clear();
  for (const Unsupported& u : unsupported(Framework::Torchtitan, config, split_of(config))) fields.push_back(u.field);
  CHECK(fields == std::vector<std::string>{"schedule.vocab", "training.zero_stage", "training.rotary_embedding",
                                           "training.optimizer_post_validation", "training.overlap_p2p_comm"});
  CHECK(unsupported(Framework::Any, config, split_of(config)).empty());
  CHECK(unsupported(Framework::Torchtitan, llama({"schedule.name=v-half"}), {}).front().nearest == "zb-v");
  // docs/frameworks.md: recomputation other than every layer in full goes to full/uniform/1, selective to none.
  CHECK(unsupported(Framework::Torchtitan, llama({"training.recompute_granularity=selective"}), {}).front().nearest ==
        "none");
  CHECK(unsupported(Framework::Torchtitan, llama({"training.recompute_granularity=full", "training.recompute_method=block"}),
                    {})
            .front()
            .nearest == "full/uniform/1");
  // torchtitan's async tensor parallelism needs torch.compile, whose kernels are fused.
  const Config async_tp = llama({"parallel.tp=2", "parallel.sequence_parallel=true", "training.tp_comm_overlap=true"});
  const std::vector<Unsupported> async_tp_refused = unsupported(Framework::Torchtitan, async_tp, {});
  CHECK(std::ranges::count(async_tp_refused, std::string("training.kernels"), &Unsupported::field) == 1);
  changes.clear();
  CHECK(nearest_runnable(Framework::Torchtitan, async_tp, split_of(async_tp), changes).training.kernels ==
        KernelProfile::Fused);
  // torchtitan's per-op policy is no Megatron-LM granularity: selective (core attention) is its nearest.
  const Config per_op = llama({"training.recompute_granularity=selective_op"});
  for (const Unsupported& u : unsupported(Framework::Torchtitan, per_op, {})) CHECK(u.field != "training.recompute_granularity");
  changes.clear();
  CHECK(nearest_runnable(Framework::Megatron, per_op, split_of(per_op), changes).training.recompute_granularity ==
        Recompute::Selective);
  // megatron/training/arguments.py: overlapped transfers only with a virtual pipeline, on by default there.
  CHECK(unsupported(Framework::Megatron, llama({"training.overlap_p2p_comm=true"}), {}).front().field ==
        "training.overlap_p2p_comm");
  CHECK(unsupported(Framework::Megatron, llama({"training.overlap_p2p_comm=true", "schedule.name=interleaved-1f1b"}), {})
            .empty());
  CHECK(as_run_by(Framework::Torchtitan, llama({})).training.overlap_p2p_comm);
  // At pp 1 torchtitan builds no pipeline: several chunks there are no plan it runs.
  CHECK(unsupported(Framework::Torchtitan,
                    llama({"parallel.pp=1", "parallel.dp=8", "schedule.name=interleaved-1f1b", "parallel.chunks=4"}), {})
            .front()
            .field == "schedule.name");
  CHECK_FALSE(as_run_by(Framework::Megatron, llama({"training.overlap_p2p_comm=true"})).training.overlap_p2p_comm);
  CHECK(as_run_by(Framework::Megatron, llama({})).training.kernels == KernelProfile::Fused);
  // DTensor's layers hold activations batch first, Megatron-LM's sequence first; a plan with the other
  // layout under tensor parallelism is refused by that field, and its nearest plan takes the framework's.
  CHECK(as_run_by(Framework::Torchtitan, llama({})).training.activation_layout == ActivationLayout::BatchFirst);
  CHECK(as_run_by(Framework::Megatron, llama({"training.activation_layout=bsh"})).training.activation_layout ==
        ActivationLayout::SequenceFirst);
  const Config batch_first = llama({"parallel.tp=2", "training.activation_layout=bsh"});
  CHECK(unsupported(Framework::Megatron, batch_first, split_of(batch_first)).front().field == "training.activation_layout");
  CHECK(nearest_runnable(Framework::Megatron, batch_first, split_of(batch_first), changes).training.activation_layout ==
        ActivationLayout::SequenceFirst);
  // Megatron-LM's norms and rotary embedding are Transformer Engine's fused kernels.
  const Config composite = llama({"training.kernels=composite"});
  CHECK(unsupported(Framework::Megatron, composite, {}).front().field == "training.kernels");
  changes.clear();
  CHECK(nearest_runnable(Framework::Megatron, composite, split_of(composite), changes).training.kernels ==
        KernelProfile::Fused);
  // Nor does it run the rotary embedding as tensor ops, which torchtitan does uncompiled.
  const Config tensor_op_rope = llama({"training.rotary_embedding=tensor_ops"});
  CHECK(unsupported(Framework::Megatron, tensor_op_rope, {}).front().field == "training.rotary_embedding");
  CHECK(nearest_runnable(Framework::Megatron, tensor_op_rope, split_of(tensor_op_rope), changes).training.rotary_embedding ==
        RotaryEmbedding::Fused);
  // Neither unpads the batch for attention as LLM Foundry's flash path does.
  const Config unpadded = llama({"precision.attention_kernel=flash2", "training.attention_unpadding=true"});
  for (const Framework framework : {Framework::Megatron, Framework::Torchtitan}) {
    CHECK(std::ranges::count(unsupported(framework, unpadded, {}), std::string("training.attention_unpadding"),
                             &Unsupported::field) == 1);
    CHECK_FALSE(nearest_runnable(framework, unpadded, split_of(unpadded), changes).training.attention_unpadding);
  }
  CHECK(as_run_by(Framework::Torchtitan, llama({})).training.rotary_embedding == RotaryEmbedding::TensorOps);
  CHECK(as_run_by(Framework::Torchtitan, llama({"training.kernels=fused"})).training.rotary_embedding ==
        RotaryEmbedding::Fused);
  // DeepSpeed's BF16_Optimizer and FSDP's flat parameters run in none of them, FSDP2 in torchtitan
  // and in PyTorch's FSDP2 (ZeRO 2 and 3): the others accumulate as the fused default.
  const auto refuses = [&](Framework framework, const Config& c) {
    return std::ranges::any_of(unsupported(framework, c, {}),
                               [](const Unsupported& u) { return u.field == "training.grad_accumulation"; });
  };
  for (const char* accumulation : {"deepspeed", "fsdp", "fsdp2"}) {
    const Config foreign = llama({fmt::format("training.grad_accumulation={}", accumulation)});
    for (const Framework framework : {Framework::Megatron, Framework::Torchtitan, Framework::Pytorch}) {
      if (framework == Framework::Torchtitan && std::string(accumulation) == "fsdp2") {
        CHECK(!refuses(framework, foreign));
        continue;
      }
      CHECK(refuses(framework, foreign));
      CHECK(nearest_runnable(framework, foreign, split_of(foreign), changes).training.grad_accumulation ==
            GradAccumulation::Fused);
    }
  }
  const Config sharded = llama({"training.grad_accumulation=fsdp2", "parallel.dp=2", "training.zero_stage=3"});
  CHECK(!refuses(Framework::Pytorch, sharded));
  CHECK(refuses(Framework::Megatron, sharded));
}

TEST_CASE("import names what is missing or does not add up") {
  CHECK_THAT(config_from_megatron("--num-layers 4\n", "a.args", 8).error().message,
             Catch::Contains("a.args: --hidden-size is missing"));
  const std::string args = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 1 "
                           "--global-batch-size 8 --vocab-size 1000 --pipeline-model-parallel-size 2 --lr 3e-4 "
                           "--data-path /data/x";
  CHECK_THAT(config_from_megatron(args, "a.args", std::nullopt).error().message, Catch::Contains("give --gpus N"));
  CHECK_THAT(config_from_megatron(args, "a.args", 3).error().message, Catch::Contains("3 GPUs are not a multiple"));
  Result<ImportedConfig> ok = config_from_megatron(args, "a.args", 4);
  REQUIRE(ok.ok());
  CHECK(ok.value().ignored == std::vector<std::string>{"--lr", "--data-path"});
  CHECK(ok.value().config["parallel"]["dp"] == 2);
  CHECK(ok.value().config["parallel"]["microbatches"] == 4);
  // --ddp-bucket-size is read with --overlap-grad-reduce, and named ignored without it, as Megatron-LM ignores it.
  Result<ImportedConfig> bucketed = config_from_megatron(args + " --ddp-bucket-size 5000000 --overlap-grad-reduce", "a.args", 4);
  REQUIRE(bucketed.ok());
  CHECK(bucketed.value().config["training"]["bucket_size"] == 5000000);
  CHECK(bucketed.value().ignored == std::vector<std::string>{"--lr", "--data-path"});
  Result<ImportedConfig> unused = config_from_megatron(args + " --ddp-bucket-size 5000000", "a.args", 4);
  REQUIRE(unused.ok());
  CHECK_FALSE(unused.value().config["training"].contains("bucket_size"));
  CHECK(unused.value().ignored == std::vector<std::string>{"--lr", "--data-path", "--ddp-bucket-size"});
  CHECK_THAT(config_from_torchtitan("[model]\nname = \"llama3\"\nflavor = \"3B\"\n", "j.toml", std::nullopt).error().message,
             Catch::Contains("j.toml: [model] llama3 3B: pipesim knows"));
  CHECK_THAT(config_from_torchtitan("[model\n", "j.toml", std::nullopt).error().message, Catch::StartsWith("j.toml:1:"));
}
