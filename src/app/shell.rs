//! The eframe shell around [`AttnlabApp`]: persistence, frame-time statistics, and a scripted
//! demo that trains a preset and saves a screenshot of every view (`scripts/screenshots.sh`).
//! The demo drives the app only through its command queue, as a user's clicks do, and reads
//! its state to know when to go on.
//!
//! Environment variables (read at start):
//! - `ATTNLAB_SCREENSHOTS=DIR`: start the editor's preset (or `ATTNLAB_PRESET=FILE`), wait for
//!   its first saved attention, save `DIR/<view>.png` for each view, then close.
//! - `ATTNLAB_FRAME_TIMES=1`: print the distribution of frame times when the window closes.
//! - `ATTNLAB_WINDOW_SIZE=WxH`: the window's first size (default 1400x900), to check the
//!   views at a laptop's 1024x700.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender};
use std::time::Instant;

use eframe::egui;

use super::command::Command;
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
    /// Frames drawn after the last screenshot.
    idle_frames: u32,
}

/// Seconds spent in `ui` per frame, and from one frame's start to the next (all of a frame's
/// work: layout, tessellation, rendering and presenting, when repaints come back to back).
#[derive(Default)]
struct FrameTimes {
    work: Vec<f64>,
    interval: Vec<f64>,
}

impl FrameTimes {
    fn report(&self, when: &str) {
        eprintln!("frame work {when}: {}", percentiles(&self.work));
        eprintln!("frame interval {when}: {}", percentiles(&self.interval));
    }
}

struct Shell {
    app: AttnlabApp,
    demo: Option<Demo>,
    /// Frame times while a run trains, and while none does (the renderer's own cost).
    training: FrameTimes,
    idle: FrameTimes,
    last_frame: Option<Instant>,
    report: bool,
}

/// Writes an egui screenshot as PNG (through tiny-skia, already linked for the figures).
fn save_png(image: &egui::ColorImage, path: &std::path::Path) -> crate::Result<()> {
    let [w, h] = image.size;
    let data: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    let size = resvg::tiny_skia::IntSize::from_wh(w as u32, h as u32)
        .ok_or_else(|| crate::Error::Figure("empty screenshot".into()))?;
    let pixmap = resvg::tiny_skia::Pixmap::from_vec(data, size)
        .ok_or_else(|| crate::Error::Figure("screenshot has the wrong size".into()))?;
    let png = pixmap
        .encode_png()
        .map_err(|e| crate::Error::Figure(format!("cannot encode screenshot: {e}")))?;
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
        let commands = self.app.commands.clone();
        if !demo.started {
            demo.started = true;
            // What each view shows by itself (the Encodings view's comparison, the Sweep view's
            // file), set up before training so their results are in when their turn comes.
            commands.push(Command::PrepareDemo);
            commands.push(Command::Start);
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
        let ready = self.app.runs.selected().is_some_and(demo_ready);
        if !ready {
            return;
        }
        if demo.wait > 0 {
            demo.wait -= 1;
            return;
        }
        if let Some(&tab) = demo.queue.first()
            && self.app.demo_ready != Some(tab)
        {
            commands.push(Command::PrepareDemoTab(tab));
            return;
        }
        let Some(tab) = demo.queue.first().copied() else {
            commands.push(Command::Stop);
            // Some frames with nothing training, to measure the renderer alone.
            demo.idle_frames += 1;
            if demo.idle_frames > 200 {
                ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            }
            return;
        };
        if self.app.tab != tab {
            commands.push(Command::Show(tab));
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

/// Whether a run has something worth a screenshot: its attention, and either a second
/// evaluation (so the curves show a trend) or its end (a run may reach its target at the first).
fn demo_ready(run: &super::RunView) -> bool {
    run.attention.is_some() && (run.evals.len() >= 2 || !run.is_running())
}

impl eframe::App for Shell {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        self.demo_step(&ctx);
        let start = Instant::now();
        self.app.show(ui);
        let training = self.app.runs.runs.iter().any(super::RunView::is_running);
        let times = if training {
            &mut self.training
        } else {
            &mut self.idle
        };
        times.work.push(start.elapsed().as_secs_f64());
        if let Some(last) = self.last_frame {
            times.interval.push(last.elapsed().as_secs_f64());
        }
        self.last_frame = Some(Instant::now());
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        eframe::set_value(storage, eframe::APP_KEY, &self.app.persisted());
    }

    fn on_exit(&mut self, _gl: Option<&eframe::glow::Context>) {
        if self.report {
            self.training.report("while training");
            self.idle.report("while idle");
        }
    }
}

/// The renderer named by `ATTNLAB_RENDERER`: `glow` (OpenGL, the default) or `wgpu`. On a
/// software rasteriser (Mesa's llvmpipe under Xvfb, a VM, a remote desktop) glow draws this window
/// about 5 times faster than wgpu on lavapipe (docs/workbench.md); on a GPU both are fast.
fn renderer() -> anyhow::Result<eframe::Renderer> {
    match std::env::var("ATTNLAB_RENDERER").as_deref() {
        Err(_) | Ok("glow") => Ok(eframe::Renderer::Glow),
        Ok("wgpu") => Ok(eframe::Renderer::Wgpu),
        Ok(other) => anyhow::bail!("ATTNLAB_RENDERER={other}: expected wgpu or glow"),
    }
}

/// The window's first size: `ATTNLAB_WINDOW_SIZE` (`WxH`) or 1400 × 900.
fn window_size() -> anyhow::Result<[f32; 2]> {
    let Ok(text) = std::env::var("ATTNLAB_WINDOW_SIZE") else {
        return Ok([1400.0, 900.0]);
    };
    let size = text
        .split_once('x')
        .and_then(|(w, h)| Some([w.parse::<f32>().ok()?, h.parse::<f32>().ok()?]))
        .filter(|[w, h]| (200.0..=10_000.0).contains(w) && (200.0..=10_000.0).contains(h));
    size.ok_or_else(|| anyhow::anyhow!("ATTNLAB_WINDOW_SIZE={text}: expected WxH, e.g. 1024x700"))
}

/// Opens the workbench window; returns when it is closed.
pub fn run_native() -> anyhow::Result<()> {
    crate::train::background_priority_is_low().map_err(anyhow::Error::msg)?;
    // Training's parallel kernels run on rayon's global pool: start it at background priority
    // (see `Priority::Background`) before anything uses it, so drawing never waits for them.
    let pool = rayon::ThreadPoolBuilder::new()
        .start_handler(|_| crate::train::lower_thread_priority())
        .build_global();
    if let Err(e) = pool {
        eprintln!("note: training threads keep normal priority ({e})");
    }
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_inner_size(window_size()?)
            .with_title("attnlab"),
        renderer: renderer()?,
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
                    idle_frames: 0,
                }
            });
            Ok(Box::new(Shell {
                app,
                demo,
                training: FrameTimes::default(),
                idle: FrameTimes::default(),
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
