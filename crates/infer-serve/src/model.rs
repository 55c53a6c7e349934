//! A model slot: everything the server keeps for one served model (its config, signatures,
//! batcher, metrics and the metadata answers), looked up by name through
//! [`crate::server::Server::model`].
//!
//! A one-model `runtime.toml` gives a server one slot; a bundle one per model directory, each
//! with its own `RuntimeConfig`, batcher (with its own [`crate::batcher::Grouping`]) and
//! metrics (sharing the server-wide series, [`crate::metrics::Metrics::sharing`]).

use crate::batcher::Batcher;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::signature::Signature;
use crate::text::TextModel;
use crate::vision::VisionModel;
use bytes::Bytes;
use infer_spec::RuntimeConfig;
use serde_json::json;
use std::sync::{Arc, OnceLock};

/// One served model.
pub struct Model {
    pub cfg: RuntimeConfig,
    pub metrics: Arc<Metrics>,
    /// Set once warm-up has succeeded.
    pub batcher: OnceLock<Batcher>,
    metadata: Bytes,
    config: Bytes,
    /// The JSON the HTTP metadata and config routes answer, from which the gRPC surface builds
    /// its messages (the same content on both).
    pub(crate) metadata_json: serde_json::Value,
    pub(crate) config_json: serde_json::Value,
    /// The tokenizer and pooling of a text model (`[text]`).
    text: Option<Arc<TextModel>>,
    /// The decoding, resizing and answers of an image model (`[vision]`).
    vision: Option<Arc<VisionModel>>,
    /// The response cache (`[response_cache]`), when the model has one.
    cache: Option<crate::cache::ResponseCache>,
    /// What requests carry and responses hold: the engine's tensors, or a text model's.
    served_inputs: Vec<infer_spec::TensorSpec>,
    served_outputs: Vec<infer_spec::TensorSpec>,
}

impl Model {
    /// A slot for the model `cfg` describes, not ready until its batcher is set.
    pub fn new(cfg: RuntimeConfig, metrics: Arc<Metrics>) -> Model {
        Model::with_text(cfg, metrics, None)
    }

    /// A slot for a model that may take text ([`TextModel::load`] of the same config).
    pub fn with_text(cfg: RuntimeConfig, metrics: Arc<Metrics>, text: Option<TextModel>) -> Model {
        // An image model's config was checked with the rest of runtime.toml: its section fits
        // the engine's tensors, so building it cannot fail here but for a config never checked.
        let vision = cfg
            .vision
            .as_ref()
            .and_then(|v| VisionModel::new(v, &cfg.inputs, &cfg.outputs).ok());
        let (served_inputs, served_outputs) = match (&text, &vision) {
            (Some(t), _) => (t.served_inputs().to_vec(), t.served_outputs().to_vec()),
            (None, Some(v)) => (v.served_inputs().to_vec(), v.served_outputs().to_vec()),
            (None, None) => (cfg.inputs.clone(), cfg.outputs.clone()),
        };
        let served = Signature {
            model: &cfg.model,
            inputs: &served_inputs,
            outputs: &served_outputs,
            max_batch_size: cfg.batching.max_batch_size,
            rows_key: "max_batch_size",
        };
        let tensors = |list: &[infer_spec::TensorSpec]| -> Vec<serde_json::Value> {
            list.iter()
                .map(
                    |t| json!({ "name": t.name, "datatype": t.datatype.as_str(), "shape": t.dims }),
                )
                .collect()
        };
        let metadata = json!({
            "name": cfg.model.name,
            "versions": [cfg.model.version],
            "platform": cfg.platform(),
            "inputs": tensors(served.inputs),
            "outputs": tensors(served.outputs),
        });
        let config_tensors =
            |list: &[infer_spec::TensorSpec], input: bool| -> Vec<serde_json::Value> {
                list.iter()
                    .map(|t| {
                        let mut v = json!({
                            "name": t.name,
                            "data_type": t.datatype.triton_name(),
                            "dims": t.dims.iter().skip(1).collect::<Vec<_>>(),
                            "is_shape_tensor": false,
                        });
                        if input {
                            v["format"] = json!("FORMAT_NONE");
                            v["allow_ragged_batch"] = json!(false);
                            v["optional"] = json!(false);
                        } else {
                            v["label_filename"] = json!("");
                        }
                        v
                    })
                    .collect()
            };
        let b = &cfg.batching;
        let config = json!({
            "name": cfg.model.name,
            "platform": cfg.platform(),
            "backend": cfg.engine.kind.as_str(),
            "version_policy": { "latest": { "num_versions": 1 } },
            "max_batch_size": b.max_batch_size,
            "input": config_tensors(served.inputs, true),
            "output": config_tensors(served.outputs, false),
            "batch_input": [],
            "batch_output": [],
            "dynamic_batching": {
                "preferred_batch_size": b.preferred(),
                "max_queue_delay_microseconds": b.max_queue_delay_us,
                "preserve_ordering": false,
                "priority_levels": 0,
                "default_priority_level": 0,
                "default_queue_policy": {
                    "timeout_action": "REJECT",
                    "default_timeout_microseconds": b.default_timeout_ms * 1000,
                    "allow_timeout_override": true,
                    "max_queue_size": b.max_queue_size,
                },
                "priority_queue_policy": {},
            },
            "instance_group": [{
                "name": cfg.model.name,
                "kind": "KIND_CPU",
                "count": b.instances,
                "gpus": [],
                "secondary_devices": [],
                "profile": [],
                "passive": false,
                "host_policy": "",
            }],
            "default_model_filename": cfg.engine.path.clone().unwrap_or_default(),
            "parameters": {},
            "model_warmup": [],
            "model_transaction_policy": { "decoupled": false },
            "response_cache": { "enable": false },
        });
        Model {
            metrics,
            batcher: OnceLock::new(),
            metadata: Bytes::from(metadata.to_string()),
            config: Bytes::from(config.to_string()),
            metadata_json: metadata,
            config_json: config,
            cache: cfg
                .response_cache
                .as_ref()
                .map(|c| crate::cache::ResponseCache::new(c.max_bytes)),
            cfg,
            text: text.map(Arc::new),
            vision: vision.map(Arc::new),
            served_inputs,
            served_outputs,
        }
    }

    /// The name routes and requests use.
    pub fn name(&self) -> &str {
        &self.cfg.model.name
    }

    /// The labels of served output `index` for the V2 classification extension: an image
    /// model's `vision.labels`, on the output its answers read.
    pub(crate) fn labels(&self, index: usize) -> Option<&[String]> {
        let v = self.cfg.vision.as_ref()?;
        (self.served_outputs.get(index)?.name == v.output && !v.labels.is_empty())
            .then_some(v.labels.as_slice())
    }

    /// What a request carries and metadata shows: the engine's tensors, or for a text model
    /// its `text` input and pooled output, for an image model its `image` input. A text or
    /// image request's rows are items of the queue, each its own engine row, so they are bounded
    /// by `max_client_batch_size`, not by the engine's batch.
    pub fn served(&self) -> Signature<'_> {
        let (max_batch_size, rows_key) = match (&self.text, &self.vision) {
            (Some(t), _) => (
                t.config().max_client_batch_size,
                "text.max_client_batch_size",
            ),
            (None, Some(v)) => (
                v.config().max_client_batch_size,
                "vision.max_client_batch_size",
            ),
            (None, None) => (self.cfg.batching.max_batch_size, "max_batch_size"),
        };
        Signature {
            model: &self.cfg.model,
            inputs: &self.served_inputs,
            outputs: &self.served_outputs,
            max_batch_size,
            rows_key,
        }
    }

    /// The response cache, when the model has one.
    pub fn cache(&self) -> Option<&crate::cache::ResponseCache> {
        self.cache.as_ref()
    }

    /// Looks `key` up in the response cache, counting the hit or miss.
    pub fn cached(&self, key: &[u8]) -> Option<crate::cache::Cached> {
        let found = self.cache.as_ref()?.get(key);
        match found {
            Some(_) => self.metrics.cache_hits.add(1),
            None => self.metrics.cache_misses.add(1),
        }
        found
    }

    /// Stores a successful answer in the response cache (when there is one).
    pub fn remember(&self, key: Vec<u8>, value: crate::cache::Cached) {
        if let Some(c) = &self.cache {
            let evicted = c.put(key, value);
            if evicted > 0 {
                self.metrics.cache_evictions.add(evicted as u64);
            }
        }
    }

    /// The tokenizer and pooling, for a text model.
    pub fn text(&self) -> Option<&TextModel> {
        self.text.as_deref()
    }

    /// The tokenizer and pooling, or the 400 that says this model takes tensors.
    pub fn text_model(&self) -> Result<&TextModel, ApiError> {
        self.text_arc().map(|t| &**t)
    }

    /// The decoding, resizing and answers, for an image model.
    pub fn vision(&self) -> Option<&VisionModel> {
        self.vision.as_deref()
    }

    pub(crate) fn vision_arc(&self) -> Option<&Arc<VisionModel>> {
        self.vision.as_ref()
    }

    pub(crate) fn text_arc(&self) -> Result<&Arc<TextModel>, ApiError> {
        self.text.as_ref().ok_or_else(|| {
            ApiError::BadRequest(format!(
                "model {:?} takes tensors, not text (its recipe has no [text] table)",
                self.name()
            ))
        })
    }

    /// What the backend takes: `runtime.toml`'s tensors, which warm-up and the engine checks
    /// use.
    pub fn engine(&self) -> Signature<'_> {
        Signature::from(&self.cfg)
    }

    /// The batcher, once warm-up is done.
    pub fn batcher(&self) -> Option<&Batcher> {
        self.batcher.get()
    }

    /// Warmed up and its device not lost: what readiness asks of a model.
    pub fn serving(&self) -> bool {
        self.batcher().is_some_and(|b| b.device_lost().is_none())
    }

    /// `GET /v2/models/{m}`'s body.
    pub fn metadata(&self) -> Bytes {
        self.metadata.clone()
    }

    /// `GET /v2/models/{m}/config`'s body.
    pub fn config(&self) -> Bytes {
        self.config.clone()
    }

    /// Records in `/v2/models/{m}/config` what the start-up check found on this node: the GPU,
    /// its driver and the TensorRT library (as Triton-style string parameters), and the GPU
    /// instance group; or the CPU engine's library that was loaded (ONNX Runtime, OpenVINO).
    /// Nothing changes when neither was found.
    pub fn set_node(&mut self, found: &infer_spec::engine::Found) {
        let param = |v: String| json!({ "string_value": v });
        if let Some((engine, v)) = found.library() {
            let Ok(mut config) = serde_json::from_slice::<serde_json::Value>(&self.config) else {
                return;
            };
            let mut parameters = serde_json::Map::new();
            parameters.insert("engine".into(), param(engine.to_owned()));
            parameters.insert(engine.into(), param(v.to_string()));
            config["parameters"] = serde_json::Value::Object(parameters);
            self.config = Bytes::from(config.to_string());
            self.config_json = config;
        }
        let Some(g) = &found.gpu else { return };
        let Ok(mut config) = serde_json::from_slice::<serde_json::Value>(&self.config) else {
            return;
        };
        config["parameters"] = json!({
            "gpu": param(g.name.clone()),
            "compute_capability": param(g.sm.sm().to_string()),
            "driver": param(g.driver.to_string()),
            "tensorrt": param(found.tensorrt.as_ref().map(|v| v.to_string()).unwrap_or_default()),
        });
        if let Some(group) = config["instance_group"].get_mut(0) {
            group["kind"] = json!("KIND_GPU");
            group["gpus"] = json!([0]);
        }
        self.config = Bytes::from(config.to_string());
        self.config_json = config;
    }
}

#[cfg(test)]
mod node_tests {
    use super::*;
    use infer_spec::engine::{ComputeCapability, Found, FoundCpu, FoundGpu};

    #[test]
    fn the_model_config_says_which_gpu_driver_and_tensorrt_were_found() {
        let cfg = RuntimeConfig::from_toml_str(
            "[model]\nname = \"m\"\n[[inputs]]\nname = \"x\"\ndatatype = \"FP32\"\ndims = [-1, 4]\n\
             [[outputs]]\nname = \"y\"\ndatatype = \"FP32\"\ndims = [-1, 4]\n\
             [engine]\nkind = \"tensorrt\"\npath = \"engine.plan\"\n",
        )
        .unwrap();
        let metrics = Arc::new(Metrics::new("m", "1", 8));
        let mut model = Model::new(cfg, metrics);
        let before = model.config.clone();
        model.set_node(&Found {
            gpu: None,
            tensorrt: None,
            onnxruntime: None,
            openvino: None,
            cpu: FoundCpu::detect(),
        });
        assert_eq!(model.config, before, "no GPU found: nothing to add");
        model.set_node(&Found {
            gpu: Some(FoundGpu {
                sm: ComputeCapability::new(9, 0),
                driver: "570.86.10".parse().unwrap(),
                name: "NVIDIA H100".into(),
            }),
            tensorrt: Some("10.16.1.11".parse().unwrap()),
            onnxruntime: None,
            openvino: None,
            cpu: FoundCpu::detect(),
        });
        let v: serde_json::Value = serde_json::from_slice(&model.config).unwrap();
        let p = &v["parameters"];
        assert_eq!(p["gpu"]["string_value"], "NVIDIA H100");
        assert_eq!(p["driver"]["string_value"], "570.86.10");
        assert_eq!(p["tensorrt"]["string_value"], "10.16.1.11");
        assert_eq!(
            p["compute_capability"]["string_value"],
            ComputeCapability::new(9, 0).sm().to_string()
        );
        assert_eq!(v["instance_group"][0]["kind"], "KIND_GPU");
    }
}
