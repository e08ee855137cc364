//! Pretrained models from Hugging Face folders against what `transformers` computes for them:
//! the tiny random checkpoints of `scripts/make_hf_fixtures.py` (tests/fixtures/hf), with
//! their logits and attention weights for two fixed inputs.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use std::path::{Path, PathBuf};

use attnlab::checkpoint;
use attnlab::model::{Ablation, HeadAblation};
use candle_core::{DType, Device, Tensor};

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(family)
}

fn max_difference(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// The model's logits within 1e-4 of transformers' (f32 sums in another order), every
/// layer's attention rows within 1e-5, and the logits with one head zero-ablated, on a random
/// row and on a repeated one.
fn assert_matches_transformers(family: &str) {
    let folder = fixture(family);
    let pretrained = checkpoint::open(&folder, &Device::Cpu).unwrap();
    let reference =
        candle_core::safetensors::load(folder.join("reference.safetensors"), &Device::Cpu).unwrap();
    let ids = reference["input_ids"].to_dtype(DType::U32).unwrap();
    let forward = pretrained.model.forward(&ids).unwrap();
    let logits = max_difference(&forward.logits, &reference["logits"]);
    assert!(logits < 1e-4, "{family}: logits differ by {logits}");
    let attentions = &reference["attentions"];
    for (layer, attention) in forward.attention.iter().enumerate() {
        let ours = &attention.as_ref().unwrap().weights;
        let theirs = attentions.get(layer).unwrap();
        let difference = max_difference(ours, &theirs);
        assert!(
            difference < 1e-5,
            "{family} layer {layer}: attention differs by {difference}"
        );
    }
    // Head 2 of layer 1 zero-ablated, against transformers' head_mask (GPT-2's fixture).
    if let Some(expected) = reference.get("ablated_logits") {
        assert_ablation_matches(&pretrained.model, &ids, (&forward.logits, expected));
    }
    let zeros = reference["logits"].zeros_like().unwrap();
    let size = max_difference(&reference["logits"], &zeros);
    assert!(
        size > 1.0,
        "{family}: the logits compared are near zero ({size})"
    );
}

/// The logits with head 2 of layer 1 zero-ablated within 1e-4 of `expected`, and moved off
/// the clean ones.
fn assert_ablation_matches(
    model: &attnlab::model::Transformer,
    ids: &Tensor,
    (clean, expected): (&Tensor, &Tensor),
) {
    let ablation = HeadAblation {
        layer: 1,
        head: 2,
        mode: Ablation::Zero,
    };
    let ablated = model.logits_ablated(ids, ablation).unwrap();
    let difference = max_difference(&ablated, expected);
    assert!(difference < 1e-4, "ablated logits differ by {difference}");
    let moved = max_difference(&ablated, clean);
    assert!(
        moved > 1e-2,
        "the ablation moved the logits by {moved} only"
    );
    for (layer, head) in [(2, 0), (1, 4)] {
        let ablation = HeadAblation {
            layer,
            head,
            mode: Ablation::Zero,
        };
        let error = model.logits_ablated(ids, ablation).unwrap_err().to_string();
        assert!(error.contains("not a head"), "{layer}.{head}: {error}");
    }
}

#[test]
fn gpt2_matches_transformers() {
    assert_matches_transformers("gpt2");
    let pretrained = checkpoint::open(&fixture("gpt2"), &Device::Cpu).unwrap();
    assert_eq!((pretrained.vocab_size, pretrained.max_len), (256, 64));
    assert_eq!(pretrained.model_config.mlp_ratio, 4);
}

#[test]
fn pythia_matches_transformers() {
    assert_matches_transformers("pythia");
    let pretrained = checkpoint::open(&fixture("pythia"), &Device::Cpu).unwrap();
    assert!(pretrained.model_config.parallel_residual);
}

/// A folder with no config, a config of a family attnlab does not open, and weights of
/// another shape than the config says: each an error naming the file and what is wrong.
#[test]
fn bad_folders_are_refused_in_words() {
    let empty = std::env::temp_dir().join(format!("attnlab-no-model-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let error = checkpoint::open(&empty, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("config.json"), "{error}");

    let copy = std::env::temp_dir().join(format!("attnlab-bad-model-{}", std::process::id()));
    std::fs::create_dir_all(&copy).unwrap();
    let config = std::fs::read_to_string(fixture("gpt2").join("config.json")).unwrap();
    std::fs::write(
        copy.join("config.json"),
        config.replace("\"n_embd\": 32", "\"n_embd\": 64"),
    )
    .unwrap();
    std::fs::copy(
        fixture("gpt2").join("model.safetensors"),
        copy.join("model.safetensors"),
    )
    .unwrap();
    let error = checkpoint::open(&copy, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("shape") && error.contains("model.safetensors"),
        "{error}"
    );

    let other_eps = config.replace(
        "\"layer_norm_epsilon\": 1e-05",
        "\"layer_norm_epsilon\": 1e-06",
    );
    std::fs::write(copy.join("config.json"), other_eps).unwrap();
    let error = checkpoint::open(&copy, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("layer_norm_eps") && error.contains("config.json"),
        "{error}"
    );

    std::fs::remove_file(copy.join("model.safetensors")).unwrap();
    let error = checkpoint::open(&copy, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("no model.safetensors"), "{error}");
    std::fs::remove_dir_all(&copy).unwrap();
    std::fs::remove_dir_all(&empty).unwrap();
}

/// `attnlab heads` on the GPT-2 fixture: a score per head of every layer, each a mean of
/// attention weights (in [0, 1]) or an entropy (at most ln of the probe's length), the probe
/// too long for the model's positions refused in words.
#[test]
fn heads_scores_every_head_of_a_pretrained_model() {
    let run = |half: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_attnlab"))
            .args(["heads", "tests/fixtures/hf/gpt2", "--format", "json"])
            .args(["--half", half, "--rows", "3"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap()
    };
    let out = run("20");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let scores = report["scores"].as_array().unwrap();
    assert_eq!(scores.len(), 2 * 4, "2 layers × 4 heads");
    for score in scores {
        let keys = [
            "induction",
            "induction_iou",
            "induction_soft_iou",
            "previous_token",
            "first_token",
        ];
        for key in keys {
            let value = score[key].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&value), "{key} = {value}");
        }
        let entropy = score["entropy"].as_f64().unwrap();
        assert!(
            entropy > 0.0 && entropy <= (40f64).ln(),
            "entropy {entropy}"
        );
    }
    let too_long = run("40");
    assert!(!too_long.status.success());
    let error = String::from_utf8_lossy(&too_long.stderr);
    assert!(error.contains("64 positions"), "{error}");
}

/// The folder's tokenizer gives the ids Hugging Face's `tokenizers` gave the fixture's sentence
/// (`tokenized.json`), and each byte-level token reads as its text (GPT-2's "Ġ" as a space).
#[test]
fn the_tokenizer_matches_hugging_faces() {
    let folder = fixture("gpt2");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("tokenized.json")).unwrap())
            .unwrap();
    let tokenizer = checkpoint::TextTokenizer::open(&folder).unwrap();
    let text = expected["text"].as_str().unwrap();
    let tokens = tokenizer.encode(text, None, 256).unwrap();
    let ids: Vec<u32> = serde_json::from_value(expected["ids"].clone()).unwrap();
    assert_eq!(tokens.ids, ids);
    assert_eq!(&tokens.tokens[..4], &["T", "h", "e", " "]);
    let first = tokenizer.encode(text, Some(7), 256).unwrap();
    assert_eq!((first.ids[0], &first.ids[1..]), (7, ids.as_slice()));
    let small = tokenizer.encode(text, None, 100).unwrap_err().to_string();
    assert!(small.contains("past the model's 100 tokens"), "{small}");
    let missing = checkpoint::TextTokenizer::open(&fixture("pythia"));
    let missing = missing.err().unwrap().to_string();
    assert!(missing.contains("no tokenizer.json"), "{missing}");
}

/// `attnlab attend`: every layer's and head's map on a text, rows summing to 1 over the keys
/// up to the query, the tokens beside them; a text too long for the positions refused.
#[test]
fn attend_shows_every_head_on_a_text() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_attnlab"))
            .args(["attend", "tests/fixtures/hf/gpt2"])
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap()
    };
    let out = run(&["--text", "The cat sat.", "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tokens = report["tokens"]["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 12, "12 bytes, no merges, no first token");
    let attention = report["attention"].as_array().unwrap();
    assert_eq!(attention.len(), 2);
    for layer in attention {
        let heads = layer.as_array().unwrap();
        assert_eq!(heads.len(), 4);
        for head in heads {
            for (q, row) in head.as_array().unwrap().iter().enumerate() {
                let row: Vec<f64> = serde_json::from_value(row.clone()).unwrap();
                assert_eq!(row.len(), q + 1);
                assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-5);
            }
        }
    }
    let scores = report["scores"].as_array().unwrap();
    assert_eq!(scores.len(), 8);
    assert!(
        scores[0]["induction"].is_null(),
        "no induction score on a text"
    );
    let ablated = run(&[
        "--text",
        "The cat sat.",
        "--format",
        "json",
        "--ablate",
        "mean",
    ]);
    assert!(
        ablated.status.success(),
        "{}",
        String::from_utf8_lossy(&ablated.stderr)
    );
    let ablated: serde_json::Value = serde_json::from_slice(&ablated.stdout).unwrap();
    let grid = &ablated["ablation"];
    let clean = grid["clean"].as_array().unwrap().len();
    assert_eq!((grid["mode"].as_str(), clean), (Some("mean"), 11));
    for head in grid["heads"].as_array().unwrap() {
        let per_token: Vec<f64> = serde_json::from_value(head["per_token"].clone()).unwrap();
        let mean = per_token.iter().sum::<f64>() / 11.0;
        assert!((head["change"].as_f64().unwrap() - mean).abs() < 1e-9);
    }
    assert_eq!(grid["heads"].as_array().unwrap().len(), 8);
    let one = run(&["--text", "a", "--format", "json"]);
    let one: serde_json::Value = serde_json::from_slice(&one.stdout).unwrap();
    let first = &one["scores"][0];
    assert!(
        first["previous_token"].is_null() && first["entropy"].is_null(),
        "{first}"
    );
    let csv = run(&["--text", "a, b", "--format", "csv"]);
    let csv = String::from_utf8_lossy(&csv.stdout);
    assert!(csv.starts_with("layer,head,query,key,query_token,key_token,weight\n"));
    assert!(
        csv.contains("0,0,1,0,\",\",a,"),
        "the comma token quoted: {csv}"
    );
    let long = "word ".repeat(20);
    let too_long = run(&["--text", &long]);
    let error = String::from_utf8_lossy(&too_long.stderr);
    assert!(
        !too_long.status.success() && error.contains("64 positions"),
        "{error}"
    );
}

#[test]
fn tinystories_matches_transformers() {
    assert_matches_transformers("tinystories");
}

/// The GPT-2 fixture saved as PyTorch's pickle (`pytorch_model.bin`) gives the logits the
/// safetensors copy gives, which match transformers'.
#[test]
fn pytorch_pickle_weights_load_as_the_safetensors_do() {
    let pickled = checkpoint::open(&fixture("gpt2-bin"), &Device::Cpu).unwrap();
    let reference =
        candle_core::safetensors::load(fixture("gpt2").join("reference.safetensors"), &Device::Cpu)
            .unwrap();
    let ids = reference["input_ids"].to_dtype(DType::U32).unwrap();
    let logits = pickled.model.forward(&ids).unwrap().logits;
    let difference = max_difference(&logits, &reference["logits"]);
    assert!(difference < 1e-4, "logits differ by {difference}");
}

/// `attnlab extrapolate MODEL_DIR --corpus FILE`: perplexity at each length on the user's text,
/// missing past GPT-2's learned positions; a model folder without --corpus, or beside other
/// targets, is refused in words.
#[test]
fn extrapolate_scores_a_pretrained_model_on_a_text_file() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_attnlab"))
            .arg("extrapolate")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap()
    };
    let model = "tests/fixtures/hf/gpt2";
    let out = run(&[
        model,
        "--corpus",
        "README.md",
        "--lengths",
        "16,64,128",
        "--format",
        "json",
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sweep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sweep["train_length"], 64);
    let ppl = sweep["ppl"]["gpt2"].as_array().unwrap();
    assert!(
        ppl[0].as_f64().is_some_and(|p| p > 1.0) && ppl[1].is_f64(),
        "{ppl:?}"
    );
    assert!(ppl[2].is_null(), "no positions past 64: {ppl:?}");
    let note = &sweep["curves"][0]["points"][2]["note"];
    assert!(note.as_str().unwrap().contains("first 64 tokens"), "{note}");
    let no_corpus = run(&[model]);
    let error = String::from_utf8_lossy(&no_corpus.stderr);
    assert!(
        !no_corpus.status.success() && error.contains("--corpus"),
        "{error}"
    );
    let beside = run(&[model, "tests/fixtures/hf/pythia", "--corpus", "README.md"]);
    let error = String::from_utf8_lossy(&beside.stderr);
    assert!(
        !beside.status.success() && error.contains("alone"),
        "{error}"
    );
}

/// A checkpoint sharded as `transformers` saves large models (`model.safetensors.index.json`
/// naming each tensor's shard) loads as the whole file does; a shard the index names but the
/// folder lacks is refused by name.
#[test]
fn a_sharded_checkpoint_loads_as_the_whole_one() {
    let whole = fixture("gpt2");
    let folder = tempfile::tempdir().unwrap();
    for file in ["config.json", "tokenizer.json"] {
        std::fs::copy(whole.join(file), folder.path().join(file)).unwrap();
    }
    let tensors =
        candle_core::safetensors::load(whole.join("model.safetensors"), &Device::Cpu).unwrap();
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let mut shards = [
        std::collections::HashMap::new(),
        std::collections::HashMap::new(),
    ];
    let mut weight_map = serde_json::Map::new();
    for (i, (name, tensor)) in tensors.into_iter().enumerate() {
        weight_map.insert(name.clone(), names[i % 2].into());
        shards[i % 2].insert(name, tensor);
    }
    for (shard, name) in shards.iter().zip(names) {
        candle_core::safetensors::save(shard, folder.path().join(name)).unwrap();
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    let index_path = folder.path().join("model.safetensors.index.json");
    std::fs::write(&index_path, index.to_string()).unwrap();
    let ids = Tensor::new(&[[1u32, 7, 42, 3, 200]], &Device::Cpu).unwrap();
    let logits = |dir: &Path| {
        let model = checkpoint::open(dir, &Device::Cpu).unwrap();
        model.model.forward(&ids).unwrap().logits
    };
    assert_eq!(max_difference(&logits(&whole), &logits(folder.path())), 0.0);
    std::fs::remove_file(folder.path().join(names[1])).unwrap();
    let error = checkpoint::open(folder.path(), &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains(names[1]) && error.contains("missing"),
        "{error}"
    );
}
