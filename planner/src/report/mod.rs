//! What `autopp estimate` and `autopp plan` print for people: the configuration, the time with
//! its breakdown and band, memory per rank, whether it fits, and for a search the margin, the
//! reasons and the alternatives. The CLI prints these strings; `--json` prints the types.

mod advice;
mod compare;
mod estimate;
mod json;
mod margin;
mod plan;

pub use advice::{advice_text, defaults_line};
pub use compare::{compare_files, compare_text, Comparison, Side};
pub use estimate::estimate_text;
pub use json::{plan_json, Inputs};
pub use margin::{BadMargin, Margin};
pub use plan::{alternatives_table, plan_text};
