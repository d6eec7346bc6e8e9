//! Facts that Rust and a CUDA kernel share, written once, in Rust. A struct passed to a kernel is
//! declared with [`c_struct!`](crate::c_struct): the macro defines the `#[repr(C)]` Rust struct
//! and its [`CStruct`] description — the C declaration, generated from the Rust fields, and
//! `static_assert`s of its size and of every field's offset as Rust laid them out. A constant
//! both sides use is emitted as a `#define` from its Rust value ([`define`]). A kernel source
//! is then the generated [`prelude`] followed by the `.cu` file, which declares none of these
//! itself: if the C compiler ever lays a struct out otherwise than Rust, or someone edits the
//! declaration, the NVRTC compile fails with a message naming the struct and the field.
//!
//! ```
//! hisparse_memory::c_struct! {
//!     /// A request as the kernel reads it.
//!     #[derive(Clone, Copy, Debug, Default)]
//!     pub struct Req {
//!         /// First position.
//!         pub first: u32,
//!         /// Its id.
//!         pub id: u64,
//!     }
//! }
//! use hisparse_memory::c_layout::CStruct;
//! assert_eq!(Req::c_decl(), "struct Req {\n    unsigned int first;\n    unsigned long long id;\n};\n");
//! assert!(Req::c_checks().contains("static_assert(sizeof(Req) == 16"));
//! assert!(Req::c_checks().contains("HS_OFFSETOF(Req, id) == 8"));
//! ```

/// A Rust type a kernel declares as the C type [`CType::c_type`].
pub trait CType {
    /// The C spelling of the type.
    fn c_type() -> String;
}

macro_rules! c_types {
    ($($t:ty => $c:literal),* $(,)?) => {$(
        impl CType for $t {
            fn c_type() -> String {
                $c.to_owned()
            }
        }
    )*};
}

c_types! {
    u8 => "unsigned char",
    u16 => "unsigned short",
    u32 => "unsigned int",
    u64 => "unsigned long long",
    i32 => "int",
    i64 => "long long",
    f32 => "float",
    bool => "bool",
}

/// A device address of `T`s that a kernel reads and writes (`T*` in C): a kernel argument
/// struct's pointer field. Made from a buffer by the backend (a typed handle), or null.
#[repr(transparent)]
pub struct DevPtr<T>(u64, std::marker::PhantomData<fn() -> T>);

/// A device address of `T`s that a kernel only reads (`const T*` in C).
#[repr(transparent)]
pub struct ConstPtr<T>(u64, std::marker::PhantomData<fn() -> T>);

macro_rules! pointer {
    ($p:ident, $c:literal) => {
        impl<T> $p<T> {
            /// The null address (an argument the kernel does not read).
            pub const fn null() -> Self {
                Self(0, std::marker::PhantomData)
            }

            /// The address `addr`.
            ///
            /// # Safety
            /// `addr` must be null or the device address of a buffer of `T`s that lives while
            /// any kernel given it runs, holding every element that kernel indexes.
            pub const unsafe fn from_raw(addr: u64) -> Self {
                Self(addr, std::marker::PhantomData)
            }

            /// The address.
            pub const fn addr(&self) -> u64 {
                self.0
            }
        }

        impl<T> Clone for $p<T> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<T> Copy for $p<T> {}

        impl<T> Default for $p<T> {
            fn default() -> Self {
                Self::null()
            }
        }

        impl<T> std::fmt::Debug for $p<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({:#x})", stringify!($p), self.0)
            }
        }

        impl<T: CType> CType for $p<T> {
            fn c_type() -> String {
                format!($c, T::c_type())
            }
        }
    };
}

pointer!(DevPtr, "{}*");
pointer!(ConstPtr, "const {}*");

// SAFETY: each is a u64 and a zero-sized marker: every bit pattern is a valid value, there is no
// padding, and all zeros is the null address.
unsafe impl<T: 'static> bytemuck::Zeroable for DevPtr<T> {}
// SAFETY: as above.
unsafe impl<T: 'static> bytemuck::Pod for DevPtr<T> {}
// SAFETY: as above.
unsafe impl<T: 'static> bytemuck::Zeroable for ConstPtr<T> {}
// SAFETY: as above.
unsafe impl<T: 'static> bytemuck::Pod for ConstPtr<T> {}

/// One field of a [`CStruct`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CField {
    /// Its name (the same in C).
    pub name: &'static str,
    /// Its C type.
    pub c_type: String,
    /// Its byte offset in Rust's layout.
    pub offset: usize,
}

/// A `#[repr(C)]` struct whose C declaration and layout checks come from its Rust definition
/// (made by [`c_struct!`](crate::c_struct)).
pub trait CStruct: Sized {
    /// Its name in C.
    const C_NAME: &'static str;

    /// Its fields, in order, with Rust's offsets.
    fn c_fields() -> Vec<CField>;

    /// `struct Name { ... };`, one field per line.
    fn c_decl() -> String {
        let mut s = format!("struct {} {{\n", Self::C_NAME);
        for f in Self::c_fields() {
            s += &format!("    {} {};\n", f.c_type, f.name);
        }
        s + "};\n"
    }

    /// `static_assert`s that C lays the struct out as Rust does: its size and alignment, and
    /// each field's offset, each failing with a message naming the struct and field.
    fn c_checks() -> String {
        let n = Self::C_NAME;
        let (size, align) = (size_of::<Self>(), align_of::<Self>());
        let mut s = format!(
            "static_assert(sizeof({n}) == {size}, \"{n}: its size differs from Rust's {size} bytes (the Rust struct is the definition)\");\n\
             static_assert(alignof({n}) == {align}, \"{n}: its alignment differs from Rust's {align}\");\n"
        );
        for f in Self::c_fields() {
            s += &format!(
                "static_assert(HS_OFFSETOF({n}, {0}) == {1}, \"{n}.{0}: its offset differs from Rust's {1}\");\n",
                f.name, f.offset
            );
        }
        s
    }
}

/// Defines a `#[repr(C)]` struct and its [`CStruct`] description (`as CName` names it
/// otherwise in C). Fields are plain numbers, `bool`s, or other such structs.
#[macro_export]
macro_rules! c_struct {
    (
        $(#[$m:meta])*
        $vis:vis struct $name:ident $(as $cname:ident)? {
            $( $(#[$fm:meta])* $fvis:vis $f:ident : $t:ty ),* $(,)?
        }
    ) => {
        $(#[$m])*
        #[repr(C)]
        $vis struct $name {
            $( $(#[$fm])* $fvis $f: $t, )*
        }

        impl $crate::c_layout::CStruct for $name {
            const C_NAME: &'static str = $crate::c_struct!(@name $name $($cname)?);
            fn c_fields() -> ::std::vec::Vec<$crate::c_layout::CField> {
                ::std::vec![$(
                    $crate::c_layout::CField {
                        name: ::core::stringify!($f),
                        c_type: <$t as $crate::c_layout::CType>::c_type(),
                        offset: ::core::mem::offset_of!($name, $f),
                    },
                )*]
            }
        }

        impl $crate::c_layout::CType for $name {
            fn c_type() -> ::std::string::String {
                <$name as $crate::c_layout::CStruct>::C_NAME.to_owned()
            }
        }
    };
    (@name $name:ident) => { ::core::stringify!($name) };
    (@name $name:ident $cname:ident) => { ::core::stringify!($cname) };
}

/// Defines a formula both sides evaluate, once: a Rust `const fn` over `u64`s and, in the const
/// `$C`, the same expression as a C `__host__ __device__` function of the same name (the
/// expression's tokens are copied as they are, so it may use only `+ - * / %`, parentheses,
/// integer literals, its parameters and [`align16`] — spelled alike in both languages).
///
/// ```
/// hisparse_memory::c_fn! {
///     /// Row of slot `slot` of hot-buffer seat `seat`.
///     pub HOT_ROW_C: fn hot_row(seat, slots, slot) = seat * (slots + 1) + slot;
/// }
/// assert_eq!(hot_row(2, 10, 3), 25);
/// assert!(HOT_ROW_C.contains("hot_row(unsigned long long seat, unsigned long long slots, unsigned long long slot)"));
/// assert!(HOT_ROW_C.contains("return seat * (slots + 1) + slot;"));
/// ```
#[macro_export]
macro_rules! c_fn {
    (
        $(#[$m:meta])*
        $vis:vis $cname:ident : fn $name:ident($first:ident $(, $rest:ident)*) = $e:expr;
    ) => {
        $(#[$m])*
        #[allow(clippy::identity_op)]
        $vis const fn $name($first: u64 $(, $rest: u64)*) -> u64 {
            #[allow(unused_imports)]
            use $crate::c_layout::align16;
            $e
        }

        /// The C form of the function of the same name (generated from its Rust expression).
        $vis const $cname: &str = ::core::concat!(
            "__host__ __device__ __forceinline__ unsigned long long ",
            ::core::stringify!($name),
            "(unsigned long long ",
            ::core::stringify!($first),
            $(", unsigned long long ", ::core::stringify!($rest),)*
            ") { return ",
            ::core::stringify!($e),
            "; }\n"
        );
    };
}

/// `x` rounded up to a multiple of 16 (in C too: [`ALIGN16_C`]).
pub const fn align16(x: u64) -> u64 {
    (x + 15) & !15
}

/// [`align16`] in C, for the formulas of [`c_fn!`](crate::c_fn).
pub const ALIGN16_C: &str = "__host__ __device__ __forceinline__ unsigned long long align16(unsigned long long x) { return (x + 15ull) & ~15ull; }\n";

/// `#define NAME value` for a constant both sides use (the value is Rust's).
pub fn define(name: &str, value: impl std::fmt::Display) -> String {
    format!("#define {name} {value}\n")
}

/// The generated head of a kernel source: the `defines`, then each struct's declaration and its
/// layout checks (in the order given: a struct before the structs that hold it).
pub fn prelude(defines: &[String], structs: &[(String, String)]) -> String {
    let mut s = String::from("// Generated from the Rust definitions (hisparse_memory::c_layout); do not edit.\n");
    s += OFFSETOF_C;
    for d in defines {
        s += d;
    }
    for (decl, checks) in structs {
        s += decl;
        s += checks;
    }
    s + "// End of the generated part.\n"
}

/// A field's offset as a constant expression: NVRTC before 13.4 has no `offsetof` builtin, but
/// its front end folds the null-pointer form inside `__INTADDR__`.
pub const OFFSETOF_C: &str =
    "#ifndef HS_OFFSETOF\n#define HS_OFFSETOF(T, f) ((unsigned long long)__INTADDR__(&(((T*)0)->f)))\n#endif\n";

/// A struct's declaration and checks, for [`prelude`].
pub fn part<T: CStruct>() -> (String, String) {
    (T::c_decl(), T::c_checks())
}

#[cfg(test)]
mod tests {
    crate::c_struct! {
        #[derive(Clone, Copy, Debug, Default)]
        struct Inner { a: u32, b: bool }
    }
    crate::c_struct! {
        #[derive(Clone, Copy, Debug, Default)]
        struct Outer as OuterC { x: u8, inner: Inner, y: u64, z: f32 }
    }

    use super::*;

    #[test]
    fn declarations_and_checks_follow_rusts_layout() {
        assert_eq!(Outer::C_NAME, "OuterC");
        let d = Outer::c_decl();
        assert!(d.contains("unsigned char x;\n    Inner inner;\n    unsigned long long y;\n    float z;"), "{d}");
        let c = Outer::c_checks();
        // x at 0, inner (align 4) at 4, y at 16, z at 24; 32 bytes.
        for needle in [
            "sizeof(OuterC) == 32",
            "HS_OFFSETOF(OuterC, inner) == 4",
            "HS_OFFSETOF(OuterC, y) == 16",
            "HS_OFFSETOF(OuterC, z) == 24",
            "alignof(OuterC) == 8",
        ] {
            assert!(c.contains(needle), "{needle} in {c}");
        }
        let p = prelude(&[define("TILE", 32)], &[part::<Inner>(), part::<Outer>()]);
        assert!(p.find("struct Inner").unwrap() < p.find("struct OuterC").unwrap());
        assert!(p.contains("#define TILE 32\n"));
        let _ = (Outer::default().x, Outer::default().inner.a, Outer::default().inner.b);
        crate::c_struct! {
            #[derive(Clone, Copy, Debug, Default)]
            struct Args { reqs: ConstPtr<Inner>, out: DevPtr<f32>, n: u32 }
        }
        let d = Args::c_decl();
        assert!(d.contains("const Inner* reqs;\n    float* out;\n    unsigned int n;"), "{d}");
        assert_eq!(Args::default().reqs.addr(), 0);
        // SAFETY: a null address, never given to a kernel here.
        assert_eq!(unsafe { DevPtr::<f32>::from_raw(0x10) }.addr(), 0x10);
    }
}
