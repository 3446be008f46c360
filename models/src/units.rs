//! Quantities as the command line prints them: bytes in GiB or MiB, durations with a unit that
//! keeps three significant figures, counts with thousands separators, and greedy word wrap.
//! One place, so that `plan`, `estimate`, `exec` and `profile` print the same number the same
//! way.

/// `mem_bytes` as GiB with one decimal (`79.6`).
pub fn gib(mem_bytes: u64) -> String {
    format!("{:.1}", mem_bytes as f64 / (1u64 << 30) as f64)
}

/// `mem_bytes` as MiB with two decimals and the unit (`1.50 MiB`).
pub fn mib(mem_bytes: u64) -> String {
    format!("{:.2} MiB", mem_bytes as f64 / (1u64 << 20) as f64)
}

/// A duration `t_s` in seconds with a unit that keeps three significant figures (`2.31 s`,
/// `14.2 ms`, `3.0 µs`); below 50 ns it is floating-point residue and prints as `0 s`.
pub fn secs(t_s: f64) -> String {
    if t_s.abs() < 5e-8 {
        String::from("0 s")
    } else if t_s >= 1.0 {
        format!("{t_s:.2} s")
    } else if t_s >= 1e-3 {
        format!("{:.1} ms", t_s * 1e3)
    } else {
        format!("{:.1} µs", t_s * 1e6)
    }
}

/// A count `x`, rounded to a whole number, with thousands separators (`1,048,576`).
pub fn thousands(x: f64) -> String {
    let s = (x.round() as u64).to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A fraction `x` as a signed percentage with one decimal (`+3.1%`, `-15.7%`); an error that
/// rounds to zero prints `+0.0%`, never `-0.0%`.
pub fn signed_pct(x: f64) -> String {
    let tenths = (1000.0 * x).round();
    // `+ 0.0` turns a negative zero into a positive one
    format!("{:+.1}%", tenths / 10.0 + 0.0)
}

/// `text` wrapped greedily at `width` characters (a longer word stays whole on its own line).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_print_with_their_units() {
        // 79.6 GiB = 85,469,417,062 bytes; 1.5 MiB = 1,572,864 bytes
        assert_eq!(gib(85_469_417_062), "79.6");
        assert_eq!(mib(1_572_864), "1.50 MiB");
        assert_eq!(secs(2.314), "2.31 s");
        assert_eq!(secs(0.01423), "14.2 ms");
        assert_eq!(secs(3e-6), "3.0 µs");
        assert_eq!(secs(-1e-12), "0 s");
        assert_eq!(thousands(1_048_576.4), "1,048,576");
        assert_eq!(thousands(999.0), "999");
    }

    #[test]
    fn an_error_that_rounds_to_zero_has_no_minus_sign() {
        assert_eq!(signed_pct(-0.00004), "+0.0%");
        assert_eq!(signed_pct(0.0), "+0.0%");
        assert_eq!(signed_pct(-0.0), "+0.0%");
        assert_eq!(signed_pct(-0.0012), "-0.1%");
        assert_eq!(signed_pct(0.2995), "+30.0%");
        assert_eq!(signed_pct(-0.157), "-15.7%");
    }

    #[test]
    fn wrap_keeps_words_whole_and_lines_within_the_width() {
        let lines = wrap(
            "the bubble binds this plan; more micro-batches would help",
            20,
        );
        assert_eq!(
            lines,
            [
                "the bubble binds",
                "this plan; more",
                "micro-batches would",
                "help"
            ]
        );
        assert!(wrap("   ", 10).is_empty());
    }
}
