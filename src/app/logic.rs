//! The shell's logic, run once per frame before anything is drawn: shortcuts, queued
//! commands, worker events, an experiment's awaited analysis, every view's finished jobs.

use eframe::egui;

use super::views::RunList;
use super::{AttnlabApp, Command, RunState, RunView, Tab, ViewContext, Views, jobs, keys, tab_of};

impl AttnlabApp {
    /// Everything that happens between frames, before anything is drawn: shortcuts, queued
    /// commands, worker events, and every view's finished jobs (whichever view is shown).
    pub fn logic(&mut self, ctx: &egui::Context) {
        self.jobs.attach(ctx);
        self.editor.refresh();
        self.shortcuts(ctx);
        let commands: Vec<Command> = self.queue.try_iter().collect();
        for command in commands {
            self.execute(command);
        }
        if let Some(text) = self.clipboard.take() {
            ctx.copy_text(text);
        }
        // A run's end first, so that an error of the same frame is what stays up.
        for ended in self.runs.drain() {
            self.status.set(ended);
        }
        if let Some(Err(e)) = jobs::take_finished(&mut self.dialog) {
            self.status.set(e.to_string());
        }
        self.start_awaited_analysis();
        let (views, cx) = self.split(ctx);
        views.logic(&cx);
    }

    /// Starts the awaited analysis once all of its runs have ended, on those that have a run
    /// folder and did not fail; forgets it if one of them left the list.
    pub(super) fn start_awaited_analysis(&mut self) {
        let Some(awaiting) = &self.awaiting else {
            return;
        };
        let runs: Option<Vec<&RunView>> = awaiting
            .runs
            .iter()
            .map(|id| self.runs.runs.iter().find(|r| r.id == *id))
            .collect();
        let Some(runs) = runs else {
            self.awaiting = None;
            return;
        };
        if runs.iter().any(|r| r.is_running()) {
            return;
        }
        let list: RunList = runs
            .iter()
            .filter(|r| r.status != RunState::Trainer(crate::train::RunStatus::Failed))
            .filter_map(|r| Some((r.name.clone(), r.dir.clone()?)))
            .collect();
        let view = self.views.view_mut(tab_of(awaiting.analysis));
        if view.is_busy() {
            // Starting now would drop, so cancel, the view's own computation: wait for it.
            return;
        }
        self.awaiting = None;
        if list.is_empty() {
            self.status
                .set("the experiment's runs failed: nothing to analyse");
            return;
        }
        view.analyse(&self.jobs, list);
    }

    /// For the screenshot demo: gets `tab` ready to be captured (the analysis views need the
    /// run stopped and their analysis computed); true once it is.
    pub(super) fn prepare_demo_tab(&mut self, tab: Tab) -> bool {
        if self.views.view_mut(tab).prepare_demo() {
            return true;
        }
        let Some(run) = self.runs.selected() else {
            return false;
        };
        if run.is_running() {
            self.stop();
            return false;
        }
        // The views pick the results up when they are drawn, so show the tab while computing.
        self.tab = tab;
        let Some(dir) = run.dir.clone() else {
            return false;
        };
        let list = vec![(run.name.clone(), dir)];
        let view = self.views.view_mut(tab);
        if !view.is_busy() {
            view.start_demo(&self.jobs, list);
        }
        false
    }

    /// The views, and the context they read (borrowed from the rest of the app).
    pub(super) fn split<'a>(
        &'a mut self,
        ctx: &'a egui::Context,
    ) -> (&'a mut Views, ViewContext<'a>) {
        let cx = ViewContext {
            ctx,
            runs: &self.runs,
            editor: &self.editor,
            exporter: &self.exporter,
            runs_root: &self.runs_root,
            commands: &self.commands,
            jobs: &self.jobs,
        };
        (&mut self.views, cx)
    }

    pub(super) fn shortcuts(&mut self, ctx: &egui::Context) {
        for command in keys::pressed(ctx) {
            self.commands.push(command);
        }
    }
}
