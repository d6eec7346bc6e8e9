//! Subcommand arguments built only for the subcommand given: [`Deferred`] wraps a command's
//! arguments so that clap defines them (`Command::defer`) when that subcommand is parsed or its
//! help shown, not all of them on every start of the program. It also keeps which arguments the
//! user wrote on the command line ([`given`]): a flag a path ignores is refused by its name,
//! even where its value equals the default.

use std::sync::Mutex;

use clap::builder::{Resettable, StyledStr};
use clap::{ArgMatches, Args, Command, FromArgMatches};

/// `augment` applied to `cmd`, the subcommand's own description kept: defined eagerly, the
/// arguments' struct describes the command first and the subcommand's doc comment replaces it;
/// deferred, the struct comes last, so the description is put back.
fn augment_kept(cmd: Command, augment: fn(Command) -> Command) -> Command {
    let (about, long_about) = (cmd.get_about().cloned(), cmd.get_long_about().cloned());
    let set = |t: Option<StyledStr>| t.map_or(Resettable::Reset, Resettable::Value);
    augment(cmd).about(set(about)).long_about(set(long_about))
}

/// The arguments `T` of one subcommand, defined when that subcommand is chosen.
#[derive(Debug)]
pub struct Deferred<T>(pub T);

/// The ids (field names) of the arguments given on the command line.
static GIVEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps the ids of `matches`' arguments that came from the command line.
fn record(matches: &ArgMatches) {
    let ids = matches
        .ids()
        .filter(|id| matches!(matches.value_source(id.as_str()), Some(clap::parser::ValueSource::CommandLine)))
        .map(|id| id.as_str().to_owned());
    // A panic while the list was held leaves a consistent Vec: keep using it.
    GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(ids);
}

/// Whether the argument with id `id` (its field's name, e.g. `host_tier_file`) was given on
/// the command line, whatever its value.
pub fn given(id: &str) -> bool {
    GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().any(|g| g == id)
}

impl<T: FromArgMatches> FromArgMatches for Deferred<T> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        record(matches);
        T::from_arg_matches(matches).map(Self)
    }

    fn from_arg_matches_mut(matches: &mut ArgMatches) -> Result<Self, clap::Error> {
        record(matches);
        T::from_arg_matches_mut(matches).map(Self)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }

    fn update_from_arg_matches_mut(&mut self, matches: &mut ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches_mut(matches)
    }
}

impl<T: Args> Args for Deferred<T> {
    fn augment_args(cmd: Command) -> Command {
        cmd.defer(|c| augment_kept(c, T::augment_args))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        cmd.defer(|c| augment_kept(c, T::augment_args_for_update))
    }

    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser, Subcommand};

    use super::*;

    #[derive(Debug, Parser)]
    struct App {
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(Debug, Subcommand)]
    enum Sub {
        /// The subcommand's own line.
        Go(Deferred<GoArgs>),
    }

    /// The arguments' struct line.
    #[derive(Debug, Args)]
    struct GoArgs {
        /// How many.
        #[arg(long)]
        n: u32,
        /// A flag with a default.
        #[arg(long, default_value_t = 3)]
        with_default: u32,
        /// Another, never given in these tests.
        #[arg(long, default_value_t = 3)]
        never_given: u32,
    }

    #[test]
    fn the_flags_given_are_known_by_name_even_at_their_default() {
        let App { command: Sub::Go(Deferred(args)) } =
            App::try_parse_from(["app", "go", "--n", "7", "--with-default", "3"]).unwrap();
        assert_eq!((args.with_default, args.never_given), (3, 3));
        assert!(given("n") && given("with_default"));
        assert!(!given("never_given"));
    }

    #[test]
    fn arguments_are_defined_only_when_their_subcommand_is_chosen_and_parse_as_before() {
        let app = App::command();
        let go = app.find_subcommand("go").expect("go is a subcommand");
        assert_eq!(go.get_arguments().count(), 0, "--n is defined before `go` is chosen");
        let App { command: Sub::Go(Deferred(args)) } = App::try_parse_from(["app", "go", "--n", "7"]).unwrap();
        assert_eq!(args.n, 7);
        let e = App::try_parse_from(["app", "go", "--m", "7"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{e}");
        assert!(e.to_string().contains("--m"), "{e}");
    }

    #[test]
    fn a_deferred_subcommand_keeps_its_own_description_and_lists_its_flags() {
        let e = App::try_parse_from(["app", "go", "--help"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        let help = e.render().to_string();
        assert!(help.starts_with("The subcommand's own line"), "{help}");
        assert!(!help.contains("struct line"), "{help}");
        assert!(help.lines().any(|l| l.contains("--n <N>") && l.contains("How many")), "{help}");
        let top = App::command().render_help().to_string();
        assert!(top.contains("The subcommand's own line"), "{top}");
    }
}
