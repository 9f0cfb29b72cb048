"""Bad input across every command line: each case must end with a non-zero exit status, exactly one
`error:` line, no traceback, and nothing written (the scratch tree is unchanged).

One table, one real tiny checkpoint (and damaged copies of it: flipped bytes, a truncated data file),
every command called in-process through its `main(argv)`."""
import json
import os
import shutil

import jax
import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from conversion import hf_to_jax, jax_to_hf, lora_to_peft, memcheck, peft_to_lora
from experiments import evaluate, generate, lm_eval, quickstart, rl, sweep, tasks, train, train_drafter
from experiments.bench import __main__ as bench
from zarya_jax import checkpoint
from zarya_jax.config import from_hf_dict
from zarya_jax.data.tokenizer import ByteTokenizer
from zarya_jax.nn import hf_params
from zarya_jax.nn.integrity import CheckpointError


def flip_bytes(path: str, count: int = 64) -> None:
    """Flips `count` bytes spread over the middle of a file."""
    data = bytearray(open(path, "rb").read())
    for i in range(count):
        data[len(data) // 4 + i * (len(data) // (2 * count))] ^= 0xFF
    open(path, "wb").write(bytes(data))


def largest_file(directory: str) -> str:
    files = [os.path.join(r, n) for r, _, names in os.walk(directory) for n in names]
    return max(files, key=os.path.getsize)


@pytest.fixture(scope="module")
def s(tmp_path_factory, tiny_config, tiny_params):
    """The scratch tree: every input the table needs, built once."""
    root = tmp_path_factory.mktemp("bad")
    p = {"root": str(root)}
    p["ckpt"] = checkpoint.save(root / "ckpt", tiny_params, tiny_config, tokenizer=ByteTokenizer())
    p["nomask"] = checkpoint.save(root / "nomask", tiny_params, tiny_config.replace(mask_token_id=None))
    p["flipped"] = str(root / "flipped")
    shutil.copytree(p["ckpt"], p["flipped"])
    flip_bytes(largest_file(os.path.join(p["flipped"], "params")))
    p["truncated"] = str(root / "truncated")
    shutil.copytree(p["ckpt"], p["truncated"])
    big = largest_file(os.path.join(p["truncated"], "params"))
    os.truncate(big, os.path.getsize(big) // 2)
    p["reshaped"] = str(root / "reshaped")  # config.json no longer matches the arrays
    shutil.copytree(p["ckpt"], p["reshaped"])
    meta = json.load(open(os.path.join(p["reshaped"], "config.json")))
    meta["model"]["intermediate_size"] = 96
    json.dump(meta, open(os.path.join(p["reshaped"], "config.json"), "w"))

    def write(name, text, mode="w"):
        path = root / name
        (path.write_bytes if mode == "wb" else path.write_text)(text)
        return str(path)

    good = "".join(json.dumps({"prompt": f"{i}+1=", "answer": f"{i + 1}"}) + "\n" for i in range(8))
    p["data"] = write("good.jsonl", good)
    p["latin1"] = write("latin1.jsonl", good.encode() + '{"prompt": "caf\xe9", "answer": "1"}\n'.encode("latin-1"), "wb")
    p["messages_str"] = write("messages.jsonl", '{"messages": "x"}\n')
    # fields that are not text (a number is refused too: it is not read as its text)
    p["listprompt"] = write("listprompt.jsonl", '{"prompt": [3], "answer": "x"}\n')
    p["numprompt"] = write("numprompt.jsonl", good.splitlines()[0] + '\n{"prompt": 3, "answer": "x"}\n')
    p["numanswer"] = write("numanswer.jsonl", '{"prompt": "1+1=", "answer": 2.5}\n')
    # an empty prompt, found only once rendered, on line 3 (after a blank line)
    p["emptyprompt"] = write("emptyprompt.jsonl", good.splitlines()[0] + '\n\n{"prompt": "", "answer": "1"}\n')
    p["file"] = write("a_file", "not a directory")
    p["lora"] = write("lora.safetensors", "definitely not safetensors")
    os.makedirs(root / "badtok")
    write("badtok/tokenizer.json", "{ broken")
    write("badtok/tokenizer_config.json", "{}")
    p["badtok"] = str(root / "badtok")
    p["sweep"] = {}
    for name, spec in {"lr": {"runs": [{"name": "a", "optim.lr": "abc"}]},
                       "slot0": {"runs": [{"name": "a", "eval.knobs.slotted.slot_size": 0}]},
                       "escape": {"runs": [{"name": "../../escape"}]},
                       "slash": {"runs": [{"name": "a/b"}]},
                       "batch0": {"runs": [{"name": "a", "eval.batch_size": 0}]},
                       "arknob": {"runs": [{"name": "a", "eval.knobs.ar.slot_size": 4}]},
                       "ok": {"runs": [{"name": "a"}]}}.items():
        p["sweep"][name] = write(f"sweep_{name}.yaml", yaml.safe_dump({"name": name, **spec}))
    p["sweep"]["garbled"] = write("sweep_garbled.yaml", "name: [unclosed\n")
    # Hugging Face directories: an index entry that leaves the folder, and an integer tensor.
    for name in ("hf_escape", "hf_int"):
        os.makedirs(root / name)
        json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 8,
                   "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "head_dim": 2, "max_position_embeddings": 16,
                   "tie_word_embeddings": True, "torch_dtype": "float32"}, open(root / name / "config.json", "w"))
    json.dump({"weight_map": {"model.embed_tokens.weight": "../outside/model.safetensors"}},
              open(root / "hf_escape" / "model.safetensors.index.json", "w"))
    config, _ = from_hf_dict(json.load(open(root / "hf_int" / "config.json")))
    tensors = {name: np.zeros(shape, np.float32) for name, shape in hf_params.hf_shapes(config).items()}
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].astype(np.int32)
    save_file(tensors, str(root / "hf_int" / "model.safetensors"))
    p["hf_escape"], p["hf_int"] = str(root / "hf_escape"), str(root / "hf_int")
    # inputs an output could land on: a prompts file, a data file named like evaluate's predictions
    p["prompts"] = write("prompts.txt", "1+1=\n2+2=\n")
    os.makedirs(root / "pred")
    p["pred"], p["pred_data"] = str(root / "pred"), write("pred/predictions.jsonl", good)
    os.makedirs(root / "datadir.jsonl")
    p["datadir"] = str(root / "datadir.jsonl")
    links = tmp_path_factory.mktemp("links")  # outside the snapshot: os.stat fails on a loop
    os.symlink(links / "loop.jsonl", links / "loop.jsonl")
    p["loop"] = str(links / "loop.jsonl")
    p["home"] = os.path.realpath(os.path.expanduser("~"))
    p["repo"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return p


def snapshot(root: str) -> dict:
    return {os.path.join(r, n): os.stat(os.path.join(r, n)).st_mtime_ns
            for r, dirs, names in os.walk(root) for n in names + dirs}


# (id, command, argv with {placeholders} from the scratch tree, a fragment the error line must hold)
CASES = [
    # ---- python -m experiments.train
    ("train/missing-data", train, "--config tiny --workdir {root}/w --set data.train={root}/nope.jsonl", "does not exist"),
    ("train/non-utf8", train, "--config tiny --workdir {root}/w --set data.train={latin1}", "not UTF-8"),
    ("train/messages-str", train, "--config tiny --workdir {root}/w --set data.train={messages_str}", "'messages' must be"),
    ("train/list-prompt", train, "--config tiny --workdir {root}/w --set data.train={listprompt}",
     "listprompt.jsonl:1: malformed record: field 'prompt' is a list ([3]); expected text"),
    ("train/number-answer", train, "--config tiny --workdir {root}/w --set data.train={numanswer}",
     "numanswer.jsonl:1: malformed record: field 'answer' is a number (2.5); expected text"),
    ("train/unknown-key", train, "--config tiny --workdir {root}/w --set optim.learning_rate=1", "optim.learning_rate"),
    ("train/bad-type", train, "--config tiny --workdir {root}/w --set optim.lr=abc", "optim.lr='abc'"),
    ("train/no-config", train, "--config nope --workdir {root}/w", "neither a file nor a preset"),
    ("train/workdir-file", train, "--config tiny --workdir {file} --set data.train={data}", "not a directory"),
    ("train/workdir-under-file", train, "--config tiny --workdir {file}/w --set data.train={data}", "is a file"),
    ("train/batch-mesh", train, "--config tiny --workdir {root}/w --set data.train={data} --set data.batch_size=3 "
     "--set mesh.num_devices=2", "data-parallel size"),
    ("train/init-missing", train, "--config tiny --workdir {root}/w --set data.train={data} --init-from {root}/nope",
     "does not exist"),
    ("train/init-flipped", train, "--config tiny --workdir {root}/w --set data.train={data} --init-from {flipped}",
     "is damaged"),
    ("train/init-truncated", train, "--config tiny --workdir {root}/w --set data.train={data} --init-from {truncated}",
     "is damaged"),
    ("train/init-reshaped", train, "--config tiny --workdir {root}/w --set data.train={data} --init-from {reshaped}",
     "config.json differs"),
    ("train/init-reshaped-noverify", train, "--config tiny --workdir {root}/w --set data.train={data} "
     "--init-from {reshaped} --no-verify", "gate_proj"),
    ("train/divergence-knob", train, "--config tiny --workdir {root}/w --set train.divergence.param_growth=0.5",
     "param_growth=0.5"),
    ("train/max-length", train, "--config tiny --workdir {root}/w --set data.max_length=1", "data.max_length=1"),
    ("train/bad-tokenizer", train, "--config tiny --workdir {root}/w --set data.train={data} "
     "--set data.tokenizer={badtok}", "cannot load the tokenizer"),
    ("train/no-argument", train, "--workdir {root}/w", "--config"),
    # ---- python -m experiments.rl
    ("rl/reward-not-importable", rl, "--base {ckpt} --workdir {root}/w --set data.train={data} "
     "--set rl.reward=no_such_module.reward", "rl.reward='no_such_module.reward' does not import"),
    ("rl/reward-not-callable", rl, "--base {ckpt} --workdir {root}/w --set data.train={data} "
     "--set rl.reward=zarya_jax.rl.rewards.DEFAULT_REWARDS", "not a function"),
    ("rl/one-generation", rl, "--base {ckpt} --workdir {root}/w --set data.train={data} "
     "--set rl.num_generations=1", "rl.num_generations=1"),
    ("rl/lora-arm-without-adapter", rl, "--base {ckpt} --workdir {root}/w --arm frozen --set data.train={data}",
     "--adapter"),
    ("rl/adapter-for-self-arm", rl, "--base {ckpt} --workdir {root}/w --arm self --adapter {ckpt} "
     "--set data.train={data}", "only the LoRA arms"),
    ("rl/off-policy-mode", rl, "--base {ckpt} --workdir {root}/w --arm slotted --set data.train={data}",
     "not on-policy"),
    ("rl/unknown-arm", rl, "--base {ckpt} --workdir {root}/w --arm spec-lora --set data.train={data}", "rl.arm"),
    ("rl/self-without-mask", rl, "--base {nomask} --workdir {root}/w --arm self --set data.train={data}",
     "--add-mask-token"),
    ("rl/base-missing", rl, "--base {root}/nope --workdir {root}/w --set data.train={data}", "does not exist"),
    ("rl/no-data", rl, "--base {ckpt} --workdir {root}/w", "data.train"),
    ("rl/workdir-is-base", rl, "--base {ckpt} --workdir {ckpt} --set data.train={data}", "--workdir"),
    ("rl/greedy", rl, "--base {ckpt} --workdir {root}/w --set data.train={data} --set rl.temperature=0",
     "rl.temperature=0"),
    ("rl/demo-with-base", rl, "--demo --base {ckpt} --workdir {root}/w", "--demo"),
    ("rl/demo-unmarked", rl, "--demo --smoke --workdir {root}/w --unmarked 1.5", "--unmarked=1.5"),
    ("rl/unmarked-without-demo", rl, "--base {ckpt} --workdir {root}/w --set data.train={data} --unmarked 0.5",
     "--unmarked"),
    # ---- python -m experiments.train_drafter
    ("drafter/base-missing", train_drafter, "--base {root}/nope --workdir {root}/w --set data.train={data}",
     "expected a checkpoint directory"),
    ("drafter/base-not-ckpt", train_drafter, "--base {badtok} --workdir {root}/w --set data.train={data}",
     "is not a zarya_jax checkpoint"),
    ("drafter/base-flipped", train_drafter, "--base {flipped} --workdir {root}/w --set data.train={data}", "is damaged"),
    ("drafter/base-truncated", train_drafter, "--base {truncated} --workdir {root}/w --set data.train={data}",
     "is damaged"),
    ("drafter/mask-noise", train_drafter, "--base {nomask} --workdir {root}/w --set data.train={data} "
     "--set drafter.lora.noise=mask", "--add-mask-token"),
    ("drafter/unknown-key", train_drafter, "--base {ckpt} --workdir {root}/w --set drafter.lora.rnk=4", "drafter.lora.rnk"),
    ("drafter/layers-name", train_drafter, "--base {ckpt} --workdir {root}/w --set data.train={data} "
     "--set drafter.lora.layers=middle", "drafter.lora.layers='middle'"),
    ("drafter/layers-beyond", train_drafter, "--base {ckpt} --workdir {root}/w --set data.train={data} "
     "--set drafter.lora.layers=0,99", "LoraConfig.layers=(0, 99)"),
    ("drafter/dcd-passes", train_drafter, "--base {ckpt} --workdir {root}/w --set data.train={data} "
     "--set drafter.objective.objective=dcd --set drafter.dcd.passes=1", "dcd.passes=1"),
    ("drafter/workdir-file", train_drafter, "--base {ckpt} --workdir {file} --set data.train={data}",
     "not a directory"),
    # ---- python -m experiments.generate
    ("generate/flipped", generate, "--ckpt {flipped} --prompt hi --output {root}/o.jsonl", "is damaged"),
    ("generate/truncated", generate, "--ckpt {truncated} --prompt hi --output {root}/o.jsonl", "is damaged"),
    ("generate/not-ckpt", generate, "--ckpt {badtok} --prompt hi", "is not a zarya_jax checkpoint"),
    ("generate/knob-for-other-mode", generate, "--ckpt {ckpt} --prompt hi --mode ar --set slot_size=4",
     "mode 'ar' has no field 'slot_size'"),
    ("generate/no-mask", generate, "--ckpt {nomask} --prompt hi --mode mdm", "--add-mask-token"),
    ("generate/passes-self", generate, "--ckpt {ckpt} --prompt hi --mode spec-self --set draft_passes=2",
     "mode 'spec-self' has no field 'draft_passes'"),
    ("generate/output-dir", generate, "--ckpt {ckpt} --prompt hi --output {badtok}", "is a directory"),
    ("generate/output-under-file", generate, "--ckpt {ckpt} --prompt hi --output {file}/o.jsonl", "not a directory"),
    ("generate/bad-lora", generate, "--ckpt {ckpt} --prompt hi --mode spec-lora --lora {lora}",
     "not a safetensors file"),
    ("generate/spec-no-lora", generate, "--ckpt {ckpt} --prompt hi --mode spec-lora", "needs --lora"),
    ("generate/bad-tokenizer", generate, "--ckpt {nomask} --prompt hi --mode ar --tokenizer {badtok}",
     "cannot load the tokenizer"),
    ("generate/list-prompt", generate, "--ckpt {ckpt} --prompts-file {listprompt}", "string 'prompt'"),
    ("generate/non-utf8-prompts", generate, "--ckpt {ckpt} --prompts-file {latin1}", "not UTF-8"),
    ("generate/draft-length-positions", generate, "--ckpt {ckpt} --prompt hi --mode spec-self "
     "--set draft_length=1000", "prompts[0] needs 1066 positions (2 prompt + 64 new (max_new_tokens=64) + 1000 "
     "look-ahead rows of spec-self's draft_length=1000) but the model has max_position_embeddings=512"),
    ("generate/max-new-0", generate, "--ckpt {ckpt} --prompt hi --max-new-tokens 0", "max_new_tokens=0"),
    # ---- python -m experiments.evaluate
    ("evaluate/limit-negative", evaluate, "--ckpt {ckpt} --data {data} --modes ar --limit -1 --out {root}/e",
     "--limit=-1"),
    ("evaluate/set-limit-negative", evaluate, "--ckpt {ckpt} --data {data} --modes ar --set eval.limit=-1 "
     "--out {root}/e", "eval.limit=-1"),
    ("evaluate/bad-regex", evaluate, "--ckpt {ckpt} --data {data} --modes ar --answer regex --answer-regex ( "
     "--out {root}/e", "not a valid regular expression"),
    ("evaluate/regex-missing", evaluate, "--ckpt {ckpt} --data {data} --modes ar --answer regex --out {root}/e",
     "needs a pattern"),
    ("evaluate/messages-str", evaluate, "--ckpt {ckpt} --data {messages_str} --modes ar --out {root}/e",
     "'messages' must be"),
    ("evaluate/list-prompt", evaluate, "--ckpt {ckpt} --data {listprompt} --modes ar --out {root}/e",
     "listprompt.jsonl:1: field 'prompt' is a list ([3]); expected text"),
    ("evaluate/number-prompt", evaluate, "--ckpt {ckpt} --data {numprompt} --modes ar --out {root}/e",
     "numprompt.jsonl:2: field 'prompt' is a number (3); expected text"),
    ("evaluate/empty-prompt", evaluate, "--ckpt {ckpt} --data {emptyprompt} --modes ar --out {root}/e",
     "emptyprompt.jsonl:3: the prompt renders to no tokens"),
    ("evaluate/non-utf8", evaluate, "--ckpt {ckpt} --data {latin1} --modes ar --out {root}/e", "not UTF-8"),
    ("evaluate/knob-mode", evaluate, "--ckpt {ckpt} --data {data} --modes ar --knob ar.mode=mdm --out {root}/e",
     "mode 'ar' has no field 'mode'"),
    ("evaluate/knob-other-mode", evaluate, "--ckpt {ckpt} --data {data} --modes ar --knob ar.slot_size=4 "
     "--out {root}/e", "mode 'ar' has no field 'slot_size'"),
    ("evaluate/knob-not-shared", evaluate, "--ckpt {ckpt} --data {data} --modes ar --knob slot_size=4 "
     "--out {root}/e", "not a shared sampling field; it is a field of mode(s) ['slotted']"),
    ("evaluate/knob-mode-not-evaluated", evaluate, "--ckpt {ckpt} --data {data} --modes ar --knob mdm.steps=4 "
     "--out {root}/e", "--knob mdm.steps=4: mode 'mdm' is not evaluated (the modes are ar)"),
    ("evaluate/set-knob-mode-not-evaluated", evaluate, "--ckpt {ckpt} --data {data} --modes ar "
     "--set eval.knobs.mdm.steps=4 --out {root}/e", "eval.knobs.mdm.steps=4: mode 'mdm' is not evaluated"),
    ("evaluate/unknown-key-suggests-keys", evaluate, "--ckpt {ckpt} --data {data} --modes ar --set eval.bogus=1 "
     "--out {root}/e", "unknown config key 'eval.bogus'; did you mean ['eval.modes', 'eval.seed']"),
    ("evaluate/draft-length-positions", evaluate, "--ckpt {ckpt} --data {data} --modes spec-self "
     "--knob spec-self.draft_length=1000 --out {root}/e", "+ 1000 look-ahead rows of spec-self's draft_length=1000"),
    ("evaluate/knob-range", evaluate, "--ckpt {ckpt} --data {data} --modes slotted --knob slotted.slot_size=0 "
     "--out {root}/e", "slot_size=0"),
    ("evaluate/no-mask-before-ar", evaluate, "--ckpt {nomask} --data {data} --modes ar,mdm --out {root}/e",
     "--add-mask-token"),
    ("evaluate/bad-lora", evaluate, "--ckpt {ckpt} --data {data} --modes spec-lora --lora {lora} --out {root}/e",
     "not a safetensors file"),
    ("evaluate/spec-lora-no-lora", evaluate, "--ckpt {ckpt} --data {data} --modes spec-lora --out {root}/e",
     "needs --lora"),
    ("evaluate/out-file", evaluate, "--ckpt {ckpt} --data {data} --modes ar --out {file}", "not a directory"),
    ("evaluate/flipped", evaluate, "--ckpt {flipped} --data {data} --modes ar --out {root}/e", "is damaged"),
    ("evaluate/truncated", evaluate, "--ckpt {truncated} --data {data} --modes ar --out {root}/e", "is damaged"),
    ("evaluate/bad-tokenizer", evaluate, "--ckpt {ckpt} --data {data} --modes ar --tokenizer {badtok} "
     "--out {root}/e", "cannot load the tokenizer"),
    ("evaluate/batch-0", evaluate, "--ckpt {ckpt} --data {data} --modes ar --batch-size 0 --out {root}/e",
     "--batch-size=0"),
    ("evaluate/unknown-mode", evaluate, "--ckpt {ckpt} --data {data} --modes beam --out {root}/e", "beam"),
    ("evaluate/missing-data", evaluate, "--ckpt {ckpt} --data {root}/nope.jsonl --modes ar --out {root}/e",
     "does not exist"),
    # ---- python -m experiments.quickstart
    ("quickstart/steps-0", quickstart, "--smoke --workdir {root}/q --steps 0", "--steps=0"),
    ("quickstart/unknown-key", quickstart, "--smoke --workdir {root}/q --set zarya.no_such_knob=1", "no_such_knob"),
    ("quickstart/ckpt-missing", quickstart, "--smoke --workdir {root}/q --ckpt {root}/nope", "does not exist"),
    ("quickstart/ckpt-flipped", quickstart, "--smoke --workdir {root}/q --ckpt {flipped}", "is damaged"),
    ("quickstart/ckpt-truncated", quickstart, "--smoke --workdir {root}/q --ckpt {truncated}", "is damaged"),
    ("quickstart/eval-batch-0", quickstart, "--smoke --workdir {root}/q --set eval.batch_size=0", "eval.batch_size=0"),
    ("quickstart/knob-other-mode", quickstart, "--smoke --workdir {root}/q --set eval.knobs.ar.slot_size=4",
     "eval.knobs.ar.slot_size: mode 'ar' has no field 'slot_size'; its fields are []"),
    ("quickstart/knob-range", quickstart, "--smoke --workdir {root}/q --set eval.knobs.slotted.slot_size=0",
     "slot_size=0"),
    ("quickstart/bad-regex", quickstart, "--smoke --workdir {root}/q --set eval.answer=regex "
     "--set eval.answer_regex=(", "not a valid regular expression"),
    ("quickstart/huge-task", quickstart, "--smoke --workdir {root}/q --set task.num_test=100000000",
     "task.num_test=100000000"),
    ("quickstart/workdir-file", quickstart, "--smoke --workdir {file}", "not a directory"),
    ("quickstart/minutes-negative", quickstart, "--smoke --workdir {root}/q --minutes -1", "--minutes=-1"),
    ("quickstart/steps-and-minutes", quickstart, "--smoke --workdir {root}/q --steps 3 --minutes 1",
     "not both"),
    ("quickstart/bad-type", quickstart, "--smoke --workdir {root}/q --set optim.lr=abc", "optim.lr='abc'"),
    ("quickstart/divergence-knob", quickstart, "--smoke --workdir {root}/q --set train.divergence.zero_grad_steps=-1",
     "zero_grad_steps=-1"),
    # ---- python -m experiments.sweep (--dry-run validates as a real run would)
    ("sweep/lr-abc", sweep, "{sweep[lr]} --dry-run", "optim.lr='abc'"),
    ("sweep/slot-size-0", sweep, "{sweep[slot0]} --dry-run", "slot_size=0"),
    ("sweep/escape-name", sweep, "{sweep[escape]} --dry-run", "run name '../../escape'"),
    ("sweep/slash-name", sweep, "{sweep[slash]} --workdir {root}/sw", "run name 'a/b'"),
    ("sweep/eval-batch-0", sweep, "{sweep[batch0]} --dry-run", "eval.batch_size=0"),
    ("sweep/knob-other-mode", sweep, "{sweep[arknob]} --dry-run", "eval.knobs.ar.slot_size"),
    ("sweep/garbled", sweep, "{sweep[garbled]} --dry-run", "does not parse"),
    ("sweep/missing", sweep, "{root}/nope.yaml --dry-run", "does not exist"),
    ("sweep/host-index", sweep, "{sweep[ok]} --dry-run --host-index 3 --num-hosts 2", "host-index=3"),
    ("sweep/bad-set", sweep, "{sweep[ok]} --dry-run --set optim.lr=abc", "optim.lr='abc'"),
    ("sweep/workdir-file", sweep, "{sweep[ok]} --workdir {file}", "not a directory"),
    # ---- python -m experiments.tasks
    ("tasks/huge", tasks, "--out {root}/t --test 100000000", "--test=100000000"),
    ("tasks/negative", tasks, "--out {root}/t --train -1", "--train=-1"),
    ("tasks/out-file", tasks, "--out {file} --train 2 --test 2", "not a directory"),
    ("tasks/difficulty", tasks, "--out {root}/t --difficulty 9", "invalid choice"),
    # ---- python -m experiments.bench (argument validation)
    ("bench/forward-layers", bench, "--out {root}/b forward --layers 0 --no-hf", "--layers=0"),
    ("bench/generate-batch", bench, "--out {root}/b generate --batch-sizes 0", "positive integers"),
    ("bench/generate-modes", bench, "--out {root}/b generate --modes beam", "--modes 'beam'"),
    ("bench/generate-flipped", bench, "--out {root}/b generate --ckpt {flipped} --no-hf", "is damaged"),
    ("bench/spec-modes", bench, "--out {root}/b spec --modes x", "--modes='x'"),
    ("bench/spec-passes", bench, "--out {root}/b spec --draft-passes 0", "--draft-passes='0'"),
    ("bench/spec-ckpt-missing", bench, "--out {root}/b spec --ckpt {root}/nope --modes spec-self", "does not exist"),
    ("bench/out-file", bench, "--out {file} transforms", "not a directory"),
    ("bench/train-batch", bench, "--out {root}/b train --batch 0", "--batch=0"),
    ("bench/unknown", bench, "--out {root}/b nope", "invalid choice"),
    # ---- python -m conversion.hf_to_jax / jax_to_hf
    ("hf_to_jax/index-escape", hf_to_jax, "--hf-dir {hf_escape} --out {root}/c", "expected a file name inside"),
    ("hf_to_jax/int-tensor", hf_to_jax, "--hf-dir {hf_int} --out {root}/c", "not floating point"),
    ("hf_to_jax/out-under-file", hf_to_jax, "--hf-dir {hf_int} --out {file}/c", "is a file"),
    ("jax_to_hf/flipped", jax_to_hf, "--ckpt {flipped} --out {root}/h", "is damaged"),
    ("jax_to_hf/truncated", jax_to_hf, "--ckpt {truncated} --out {root}/h", "is damaged"),
    ("jax_to_hf/out-under-file", jax_to_hf, "--ckpt {ckpt} --out {file}/h", "is a file"),
] + [
    # ---- outputs that would land on an input, or on a folder that is never an output
    ("generate/output-is-prompts", generate, "--ckpt {ckpt} --prompts-file {prompts} --output {prompts}",
     "is the input --prompts-file"),
    ("generate/output-in-ckpt", generate, "--ckpt {ckpt} --prompt hi --output {ckpt}/config.json",
     "lies inside the input --ckpt"),
    ("evaluate/out-is-ckpt", evaluate, "--ckpt {ckpt} --data {data} --modes ar --out {ckpt}", "is the input --ckpt"),
    ("evaluate/out-in-ckpt", evaluate, "--ckpt {ckpt} --data {data} --modes ar --out {ckpt}/eval",
     "lies inside the input --ckpt"),
    ("evaluate/out-root", evaluate, "--ckpt {ckpt} --data {data} --modes ar --out /", "filesystem root"),
    ("evaluate/out-home", evaluate, "--ckpt {ckpt} --data {data} --modes ar --out {home}", "home directory"),
    ("evaluate/out-repo", evaluate, "--ckpt {ckpt} --data {data} --modes ar --out {repo}", "repository"),
    ("evaluate/out-holds-data", evaluate, "--ckpt {ckpt} --data {pred_data} --modes ar --out {pred}",
     "contains the input --data"),
    ("evaluate/out-is-data", evaluate, "--ckpt {ckpt} --data {data} --modes ar --out {data}", "is the input --data"),
    ("train/workdir-in-init", train, "--config tiny --workdir {ckpt}/run --set data.train={data} --init-from {ckpt}",
     "lies inside the input train.init_from"),
    ("train/workdir-root", train, "--config tiny --workdir / --set data.train={data}", "filesystem root"),
    ("drafter/workdir-is-base", train_drafter, "--base {ckpt} --workdir {ckpt} --set data.train={data}",
     "is the input --base"),
    ("quickstart/workdir-in-ckpt", quickstart, "--smoke --workdir {ckpt}/q --ckpt {ckpt}",
     "lies inside the input eval.ckpt"),
    ("quickstart/workdir-repo", quickstart, "--smoke --workdir {repo}", "repository"),
    ("sweep/workdir-home", sweep, "{sweep[ok]} --workdir {home}", "home directory"),
    ("sweep/workdir-is-spec", sweep, "{sweep[ok]} --workdir {sweep[ok]}", "is the input sweep file"),
    ("tasks/out-root", tasks, "--out / --train 2 --test 2", "filesystem root"),
    ("bench/out-in-ckpt", bench, "--out {ckpt}/b generate --ckpt {ckpt} --no-hf", "lies inside the input --ckpt"),
    ("hf_to_jax/out-in-hf-dir", hf_to_jax, "--hf-dir {hf_int} --out {hf_int}/c", "lies inside the input --hf-dir"),
    ("jax_to_hf/out-in-ckpt", jax_to_hf, "--ckpt {ckpt} --out {ckpt}/hf", "lies inside the input --ckpt"),
    ("lora_to_peft/out-in-adapter", lora_to_peft, "--adapter {badtok} --out {badtok}/peft",
     "lies inside the input --adapter"),
    ("peft_to_lora/out-in-peft", peft_to_lora, "--peft {badtok} --out {badtok}/lora", "lies inside the input --peft"),
    ("memcheck/workdir-root", memcheck, "--workdir / --size-gb 0.001", "filesystem root"),
    ("lm_eval/output-in-ckpt", lm_eval, "--model zarya --model_args ckpt={ckpt} --tasks none --output_path {ckpt}/r",
     "lies inside the input ckpt"),
    # ---- numbers out of range: seeds (uint32), step counts (≤ 10^9), int32, NaN and inf
    ("generate/seed-huge", generate, "--ckpt {ckpt} --prompt hi --seed 99999999999999999999",
     "--seed=99999999999999999999"),
    ("generate/seed-negative", generate, "--ckpt {ckpt} --prompt hi --seed -1", "--seed=-1"),
    ("generate/temperature-inf", generate, "--ckpt {ckpt} --prompt hi --set temperature=inf", "temperature=inf"),
    ("evaluate/seed-huge", evaluate, "--ckpt {ckpt} --data {data} --modes ar --seed 4294967296 --out {root}/e",
     "--seed=4294967296"),
    ("evaluate/max-new-huge", evaluate, "--ckpt {ckpt} --data {data} --modes ar --max-new-tokens 3000000000 "
     "--out {root}/e", "--max-new-tokens=3000000000"),
    ("evaluate/knob-nan", evaluate, "--ckpt {ckpt} --data {data} --modes slotted --knob slotted.slot_threshold=nan "
     "--out {root}/e", "slot_threshold=nan"),
    ("quickstart/steps-huge", quickstart, "--smoke --workdir {root}/q --steps 2000000000", "--steps=2000000000"),
    ("quickstart/set-steps-1e23", quickstart, "--smoke --workdir {root}/q --set train.steps=1e23", "steps=1e+23"),
    ("quickstart/minutes-nan", quickstart, "--smoke --workdir {root}/q --minutes nan", "--minutes=nan"),
    ("quickstart/minutes-inf", quickstart, "--smoke --workdir {root}/q --minutes inf", "--minutes=inf"),
    ("quickstart/lr-nan", quickstart, "--smoke --workdir {root}/q --set optim.lr=nan", "lr=nan"),
    ("quickstart/task-seed-huge", quickstart, "--smoke --workdir {root}/q --set task.seed=4294967296",
     "seed=4294967296"),
    ("train/lr-inf", train, "--config tiny --workdir {root}/w --set data.train={data} --set optim.lr=inf", "lr=inf"),
    ("train/seed-huge", train, "--config tiny --workdir {root}/w --set data.train={data} --set train.seed=4294967296",
     "seed=4294967296"),
    ("train/steps-1e23", train, "--config tiny --workdir {root}/w --set data.train={data} --set train.steps=1e23",
     "steps=1e+23"),
    ("train/batch-int32", train, "--config tiny --workdir {root}/w --set data.train={data} "
     "--set data.batch_size=1e12", "batch_size=1000000000000"),
    ("drafter/alpha-nan", train_drafter, "--base {ckpt} --workdir {root}/w --set data.train={data} "
     "--set drafter.lora.alpha=nan", "alpha=nan"),
    ("sweep/set-nan", sweep, "{sweep[ok]} --dry-run --set zarya.alpha0=nan", "alpha0=nan"),
    ("tasks/seed-huge", tasks, "--out {root}/t --train 2 --test 2 --seed 8589934592", "--seed=8589934592"),
    ("bench/seed-negative", bench, "--out {root}/b forward --seed -5 --no-hf", "--seed=-5"),
    ("memcheck/size-negative", memcheck, "--size-gb -1", "--size-gb=-1.0"),
    ("memcheck/size-nan", memcheck, "--size-gb nan", "--size-gb=nan"),
    # ---- duplicate decoding modes
    ("evaluate/modes-twice", evaluate, "--ckpt {ckpt} --data {data} --modes ar,mdm,ar --out {root}/e",
     "given more than once"),
    ("quickstart/modes-twice", quickstart, "--smoke --workdir {root}/q --modes ar,ar", "given more than once"),
    ("quickstart/set-modes-twice", quickstart, "--smoke --workdir {root}/q --set eval.modes=[ar,ar]",
     "given more than once"),
    # ---- an input path that is not a file
    ("evaluate/data-directory", evaluate, "--ckpt {ckpt} --data {datadir} --modes ar --out {root}/e",
     "is a directory"),
    ("evaluate/data-link-loop", evaluate, "--ckpt {ckpt} --data {loop} --modes ar --out {root}/e",
     "symbolic link loop"),
    ("train/data-directory", train, "--config tiny --workdir {root}/w --set data.train={datadir}", "is a directory"),
    ("train/data-link-loop", train, "--config tiny --workdir {root}/w --set data.train={loop}", "symbolic link loop"),
    ("generate/prompts-directory", generate, "--ckpt {ckpt} --prompts-file {datadir}", "is a directory"),
    ("sweep/spec-directory", sweep, "{datadir} --dry-run", "is a directory"),
]


@pytest.mark.parametrize("name,cli,argv,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input(s, capsys, name, cli, argv, fragment):
    args = argv.format(**s).split()
    before = snapshot(s["root"])
    try:
        code = cli.main(args)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out = capsys.readouterr()
    errors = [line for line in out.err.splitlines() if "error:" in line]
    assert code not in (0, None), out.err
    assert len(errors) == 1, out.err
    assert fragment in errors[0], errors[0]
    assert "Traceback" not in out.err + out.out
    assert snapshot(s["root"]) == before, "output was written"


def test_flipped_checkpoint_loads_only_unverified(s):
    """The damage is real: unverified, the flipped checkpoint either loads with other weights or, where a
    flip lands in a compressed chunk's framing (the layout depends on the writer), fails to decode."""
    good, _ = checkpoint.load(s["ckpt"])
    try:
        bad, _ = checkpoint.load(s["flipped"], verify=False)
    except CheckpointError as e:
        assert "cannot read param" in str(e)
        return
    diff = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(good), jax.tree.leaves(bad))]
    assert any(diff)


def test_truncated_checkpoint_names_the_param_and_the_cause(s):
    """A truncated data file: the param, the params directory and a short cause, no object repr (Orbax wraps
    TensorStore's error in one holding `<bound method … of TensorStore({`, cut mid-way)."""
    for verify in (True, False):
        with pytest.raises(CheckpointError) as e:
            checkpoint.load(s["truncated"], verify=verify)
        message = str(e.value)
        assert "is damaged: cannot read param layers/" in message, message
        assert f"{s['truncated']}/params" in message and "a data file is truncated; OUT_OF_RANGE" in message
        assert "<" not in message and "TensorStore(" not in message and len(message) < 600, message
