//! The eframe shell around [`AttnlabApp`]: persistence, frame-time statistics, and a scripted
//! demo that trains a preset and saves a screenshot of every view (`scripts/screenshots.sh`).
//!
//! Environment variables (read at start):
//! - `ATTNLAB_SCREENSHOTS=DIR`: start the editor's preset (or `ATTNLAB_PRESET=FILE`), wait for
//!   its first saved attention, save `DIR/<view>.png` for each view, then close.
//! - `ATTNLAB_FRAME_TIMES=1`: print the distribution of frame times when the window closes.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender};
use std::time::Instant;

use eframe::egui;

use super::{AttnlabApp, Persisted, Tab};

/// The scripted demo's progress.
struct Demo {
    folder: PathBuf,
    started: bool,
    /// Views still to capture, and frames to wait before the next capture.
    queue: Vec<Tab>,
    wait: u32,
    saved: Sender<String>,
    done: Receiver<String>,
    /// Frames since the pending screenshot was asked for (`None`: none pending); one that
    /// never arrives is asked for again.
    in_flight: Option<u32>,
}

struct Shell {
    app: AttnlabApp,
    demo: Option<Demo>,
    /// Seconds spent in `ui` per frame, and between frames, while a run was training.
    frame_work: Vec<f64>,
    frame_interval: Vec<f64>,
    last_frame: Option<Instant>,
    report: bool,
}

/// Writes an egui screenshot as PNG (through tiny-skia, already linked for the figures).
fn save_png(image: &egui::ColorImage, path: &std::path::Path) -> crate::Result<()> {
    let [w, h] = image.size;
    let data: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    let size = resvg::tiny_skia::IntSize::from_wh(w as u32, h as u32)
        .ok_or_else(|| crate::Error::Other("empty screenshot".into()))?;
    let pixmap = resvg::tiny_skia::Pixmap::from_vec(data, size)
        .ok_or_else(|| crate::Error::Other("screenshot has the wrong size".into()))?;
    let png = pixmap
        .encode_png()
        .map_err(|e| crate::Error::Other(format!("cannot encode screenshot: {e}")))?;
    crate::io::write_bytes(path, &png)
}

/// p50, p95 and max of `values` in milliseconds.
fn percentiles(values: &[f64]) -> String {
    if values.is_empty() {
        return "no frames".into();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| 1e3 * sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    format!(
        "p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms over {} frames",
        at(0.5),
        at(0.95),
        at(1.0),
        sorted.len()
    )
}

impl Shell {
    fn demo_step(&mut self, ctx: &egui::Context) {
        let Some(demo) = &mut self.demo else {
            return;
        };
        ctx.request_repaint(); // keep frames coming without input
        if !demo.started {
            demo.started = true;
            // Something to compare in the Encodings view: the paper's series and RoPE's decay.
            for name in ["alibi", "type1", "type2", "inv-n", "rope"] {
                self.app.encodings.ticked.insert(name.to_string());
            }
            self.app.start(ctx);
            return;
        }
        if let Ok(message) = demo.done.try_recv() {
            eprintln!("{message}");
            demo.in_flight = None;
        }
        if let Some(frames) = &mut demo.in_flight {
            *frames += 1;
            if *frames < 300 {
                return;
            }
            eprintln!("a screenshot did not arrive; asking again");
            demo.in_flight = None;
            demo.queue.insert(0, self.app.tab);
        }
        let ready = self
            .app
            .runs
            .selected()
            .is_some_and(|r| r.attention.is_some() && r.evals.len() >= 2);
        if !ready {
            return;
        }
        if demo.wait > 0 {
            demo.wait -= 1;
            return;
        }
        let Some(tab) = demo.queue.first().copied() else {
            self.app.stop();
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            return;
        };
        if self.app.tab != tab {
            self.app.tab = tab;
            demo.wait = 30;
            return;
        }
        demo.queue.remove(0);
        demo.wait = 5;
        demo.in_flight = Some(0);
        let path = demo.folder.join(format!(
            "{}.png",
            tab.label().to_lowercase().replace(' ', "-")
        ));
        let saved = demo.saved.clone();
        ctx.request_screenshot(move |image| {
            let message = match save_png(&image, &path) {
                Ok(()) => format!("screenshot saved to {}", path.display()),
                Err(e) => format!("screenshot failed: {e}"),
            };
            let _ = saved.send(message);
        });
    }
}

impl eframe::App for Shell {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        self.demo_step(&ctx);
        let start = Instant::now();
        self.app.show(ui);
        let training = self.app.runs.runs.iter().any(super::RunView::is_running);
        if training {
            self.frame_work.push(start.elapsed().as_secs_f64());
            if let Some(last) = self.last_frame {
                self.frame_interval.push(last.elapsed().as_secs_f64());
            }
        }
        self.last_frame = Some(Instant::now());
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        eframe::set_value(storage, eframe::APP_KEY, &self.app.persisted());
    }

    fn on_exit(&mut self) {
        if self.report {
            eprintln!(
                "frame work while training: {}",
                percentiles(&self.frame_work)
            );
            eprintln!(
                "frame interval while training: {}",
                percentiles(&self.frame_interval)
            );
        }
    }
}

/// Opens the workbench window; returns when it is closed.
pub fn run_native() -> anyhow::Result<()> {
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_inner_size([1400.0, 900.0])
            .with_title("attnlab"),
        ..Default::default()
    };
    let screenshots = std::env::var_os("ATTNLAB_SCREENSHOTS").map(PathBuf::from);
    let preset = std::env::var_os("ATTNLAB_PRESET").map(PathBuf::from);
    let report = std::env::var_os("ATTNLAB_FRAME_TIMES").is_some() || screenshots.is_some();
    eframe::run_native(
        "attnlab",
        options,
        Box::new(move |cc| {
            let persisted = cc
                .storage
                .and_then(|s| eframe::get_value::<Persisted>(s, eframe::APP_KEY))
                .unwrap_or_default();
            let mut app = AttnlabApp::new(persisted);
            if let Some(path) = &preset {
                app.open_preset(path);
            }
            let demo = screenshots.map(|folder| {
                let (saved, done) = std::sync::mpsc::channel();
                let _ = std::fs::create_dir_all(&folder);
                Demo {
                    folder,
                    started: false,
                    queue: Tab::ALL.to_vec(),
                    wait: 0,
                    saved,
                    done,
                    in_flight: None,
                }
            });
            Ok(Box::new(Shell {
                app,
                demo,
                frame_work: Vec::new(),
                frame_interval: Vec::new(),
                last_frame: None,
                report,
            }))
        }),
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "cannot open the window ({e}); the command-line tools still work, see attnlab --help"
        )
    })
}
